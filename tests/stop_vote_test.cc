// The flags every rank acts on at the same step (GradientSync::voteFlags: the stop request, the
// time to checkpoint): every rank learns of any rank's flag at the same call, one call after it
// was raised, whichever rank raised it and however many did.
#include <gtest/gtest.h>

#include "aiacc/comm/data_parallel.h"
#include "tests/comm_test_util.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc::comm {
namespace {

using namespace test;  // runRanks, expectNoErrors, the test net

// `votes[r][k]`: the flags rank r raises at call k. Returns what each rank's calls returned,
// calling until bit 0 (stop) comes back (or `calls` times), with a training step's buckets
// between calls.
std::vector<std::vector<int>> voteRounds(int W, const std::vector<std::vector<int>>& votes, int calls, bool shm) {
  std::vector<std::vector<int>> answers(W);
  expectNoErrors(runRanks(
      W,
      [&](int r, std::shared_ptr<Transport> t) {
    torch::manual_seed(1);
    Net net;
    DataParallel dp(net.ptr(), t, WorldInfo{r, W, r, W});
    for (int k = 0; k < calls; ++k) {
      dp.beforeForward();
      net->forward(inputs(2, 10 + k)).sum().backward();
      ASSERT_TRUE(dp.finishBackward());
      const uint8_t agreed = dp.voteFlags(static_cast<uint8_t>(votes[r][k]));
      answers[r].push_back(agreed);
      if (agreed & 1) break;
    }
    // Collectives after the agreement still line up (an evaluation's sums, the report's).
    at::Tensor one = at::ones({1}, at::kDouble);
    dp.allreduceSum(one);
    EXPECT_EQ(one.item<double>(), W);
      },
      /*channels=*/2, std::chrono::seconds(30), /*ranks_per_node=*/0, shm));
  return answers;
}

TEST(StopVote, EveryRankStopsAtTheCallAfterTheFirstVote) {
  for (const bool shm : {false, true}) {
    const int W = 3, calls = 8;
    // Rank 1 alone wants to stop from call 3 (0-based) on; rank 2 from call 5 (seconds later).
    std::vector<std::vector<int>> votes(W, std::vector<int>(calls, 0));
    for (int k = 3; k < calls; ++k) votes[1][k] = 1;
    for (int k = 5; k < calls; ++k) votes[2][k] = 1;
    const auto answers = voteRounds(W, votes, calls, shm);
    const std::vector<int> want = {0, 0, 0, 0, 1};
    for (int r = 0; r < W; ++r) EXPECT_EQ(answers[r], want) << "rank " << r << (shm ? " (shm)" : "");
  }
}

TEST(StopVote, NobodyVotesNobodyStops) {
  const int W = 2, calls = 6;
  const auto answers = voteRounds(W, std::vector<std::vector<int>>(W, std::vector<int>(calls, 0)), calls, true);
  for (int r = 0; r < W; ++r) EXPECT_EQ(answers[r], std::vector<int>(calls, 0)) << "rank " << r;
}

// The first call has no earlier vote to read: a vote there is answered at the second call.
TEST(StopVote, AVoteAtTheFirstCallStopsAtTheSecond) {
  const int W = 2, calls = 4;
  std::vector<std::vector<int>> votes(W, std::vector<int>(calls, 0));
  votes[0][0] = 1;
  const auto answers = voteRounds(W, votes, calls, true);
  for (int r = 0; r < W; ++r) EXPECT_EQ(answers[r], (std::vector<int>{0, 1})) << "rank " << r;
}

// Flags are independent bits: rank 0's "checkpoint now" (bit 1) at calls 1 and 4 comes back to
// every rank at calls 2 and 5 alone, beside rank 1's stop (bit 0) raised at call 4.
TEST(StopVote, FlagsAreIndependentBits) {
  const int W = 2, calls = 8;
  std::vector<std::vector<int>> votes(W, std::vector<int>(calls, 0));
  votes[0][1] = votes[0][4] = 2;
  votes[1][4] = 1;
  const auto answers = voteRounds(W, votes, calls, true);
  for (int r = 0; r < W; ++r) EXPECT_EQ(answers[r], (std::vector<int>{0, 0, 2, 0, 0, 3})) << "rank " << r;
}

// Alone (LocalSync, the default through allreduceSum): the vote answers itself at once.
TEST(StopVote, AloneTheVoteIsAnsweredAtOnce) {
  LocalSync local;
  EXPECT_EQ(local.voteFlags(0), 0);
  EXPECT_EQ(local.voteFlags(1), 1);
  EXPECT_EQ(local.voteFlags(6), 6);
}

}  // namespace
}  // namespace aiacc::comm
