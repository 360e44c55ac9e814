// The stop agreement (GradientSync::voteStop): every rank learns of any rank's stop wish at the
// same call, one call after it was voted, whichever rank voted and however many did.
#include <gtest/gtest.h>

#include "comm/data_parallel.h"
#include "tests/comm_test_util.h"
#include "tests/data_parallel_test_util.h"

namespace aiacc::comm {
namespace {

using namespace test;  // runRanks, expectNoErrors, the test net

// `votes[r][k]`: what rank r votes at call k. Returns what each rank's calls returned, calling
// until the vote says stop (or `calls` times), with a training step's buckets between calls.
std::vector<std::vector<bool>> voteRounds(int W, const std::vector<std::vector<bool>>& votes, int calls, bool shm) {
  std::vector<std::vector<bool>> answers(W);
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
      const bool stop = dp.voteStop(votes[r][k]);
      answers[r].push_back(stop);
      if (stop) break;
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
    std::vector<std::vector<bool>> votes(W, std::vector<bool>(calls, false));
    for (int k = 3; k < calls; ++k) votes[1][k] = true;
    for (int k = 5; k < calls; ++k) votes[2][k] = true;
    const auto answers = voteRounds(W, votes, calls, shm);
    const std::vector<bool> want = {false, false, false, false, true};
    for (int r = 0; r < W; ++r) EXPECT_EQ(answers[r], want) << "rank " << r << (shm ? " (shm)" : "");
  }
}

TEST(StopVote, NobodyVotesNobodyStops) {
  const int W = 2, calls = 6;
  const auto answers = voteRounds(W, std::vector<std::vector<bool>>(W, std::vector<bool>(calls, false)), calls, true);
  for (int r = 0; r < W; ++r) EXPECT_EQ(answers[r], std::vector<bool>(calls, false)) << "rank " << r;
}

// The first call has no earlier vote to read: a vote there is answered at the second call.
TEST(StopVote, AVoteAtTheFirstCallStopsAtTheSecond) {
  const int W = 2, calls = 4;
  std::vector<std::vector<bool>> votes(W, std::vector<bool>(calls, false));
  votes[0][0] = true;
  const auto answers = voteRounds(W, votes, calls, true);
  for (int r = 0; r < W; ++r) EXPECT_EQ(answers[r], (std::vector<bool>{false, true})) << "rank " << r;
}

// Alone (LocalSync, the default through allreduceSum): the vote answers itself at once.
TEST(StopVote, AloneTheVoteIsAnsweredAtOnce) {
  LocalSync local;
  EXPECT_FALSE(local.voteStop(false));
  EXPECT_TRUE(local.voteStop(true));
}

}  // namespace
}  // namespace aiacc::comm
