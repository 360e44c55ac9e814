// Agreement of the ranks' settings before the first step (comm/agreement.h, app/job_settings.h):
// ranks as threads over one store, and real aiacc_train processes started with different
// options or data, which must both stop within seconds naming the option, not time out.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "app/job_settings.h"
#include "aiacc/comm/agreement.h"
#include "aiacc/comm/store.h"
#include "aiacc/comm/transport.h"
#include "tests/comm_test_util.h"
#include "tests/test_util.h"

namespace aiacc::comm {
namespace {

Settings someSettings() {
  return {{"--allreduce-dtype", "fp32"}, {"--streams", "auto"}, {"dataset", "4 classes, 128 train"}};
}

std::vector<std::string> agree(int world, const std::function<Settings(int)>& settings_of,
                               std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto store = makeHashStore();
  return test::runThreads(world, [&](int r) {
    WorldInfo w;
    w.rank = r;
    w.world = world;
    agreeAcrossRanks(*store, w, settings_of(r), timeout);
  });
}

TEST(Agreement, EncodingRoundTripsAnyBytes) {
  Settings s = {{"a", ""}, {"", "b"}, {std::string("n\0ul", 4), std::string(300, '\xff')}};
  const Settings back = decodeSettings(encodeSettings(s));
  ASSERT_EQ(back.size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(back[i].name, s[i].name);
    EXPECT_EQ(back[i].value, s[i].value);
  }
  const std::string bytes = encodeSettings(s);
  EXPECT_THROW(decodeSettings(bytes.substr(0, bytes.size() - 1)), Error);
  EXPECT_THROW(decodeSettings(bytes + "x"), Error);
  EXPECT_THROW(decodeSettings("garbage"), Error);
}

TEST(Agreement, EqualSettingsPass) {
  const auto errors = agree(4, [](int) { return someSettings(); });
  test::expectNoErrors(errors);
}

// Rank 2 of 4 differs: every rank fails with the same line, naming rank 2, the option and both
// values; rank 3 (which differs from rank 0 too, but equals rank 2) is not the one named.
TEST(Agreement, FirstDifferingRankAndOptionNamedOnEveryRank) {
  const auto errors = agree(4, [](int r) {
    Settings s = someSettings();
    if (r >= 2) s[0].value = "bf16";
    return s;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find("--allreduce-dtype is bf16 on rank 2 but fp32 on rank 1 (and rank 0)"), std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_EQ(errors[r], errors[0]);
  }
}

TEST(Agreement, SeveralDifferencesNameTheFirstRankAndCountTheRest) {
  const auto errors = agree(5, [](int r) {
    Settings s = someSettings();
    if (r == 1) s[2].value = "5 classes, 128 train";  // rank 1 differs from 0, rank 2 from 1
    if (r == 4) s[1].value = "4";
    return s;
  });
  for (int r = 0; r < 5; ++r) {
    EXPECT_NE(errors[r].find("dataset is 5 classes, 128 train on rank 1 but 4 classes, 128 train on rank 0"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("3 ranks differ from their predecessor"), std::string::npos) << errors[r];
  }
}

TEST(Agreement, DifferentSettingListsAreNamed) {
  const auto errors = agree(2, [](int r) {
    Settings s = someSettings();
    if (r == 1) s.push_back({"--new-option", "1"});
    return s;
  });
  EXPECT_NE(errors[0].find("rank 1 has 4 settings but rank 0 has 3"), std::string::npos) << errors[0];
}

// A rank that never arrives: the others fail after the timeout, naming what they waited for.
TEST(Agreement, MissingRankIsACommErrorAfterTheTimeout) {
  auto store = makeHashStore();
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    WorldInfo w;
    w.rank = 2;
    w.world = 3;
    agreeAcrossRanks(*store, w, someSettings(), std::chrono::milliseconds(300));
  } catch (const CommError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("waiting for rank 1's job settings"), std::string::npos) << what;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// What aiacc_train compares: paths are not settings, contents are.
TEST(Agreement, DatasetFingerprintIgnoresThePathAndSeesTheClasses) {
  const std::string a = app::datasetFingerprint({"cat", "dog"}, 10, 4);
  EXPECT_EQ(a, app::datasetFingerprint({"cat", "dog"}, 10, 4));
  EXPECT_NE(a, app::datasetFingerprint({"cat", "dogs"}, 10, 4));
  EXPECT_NE(a, app::datasetFingerprint({"catd", "og"}, 10, 4));  // names are delimited
  EXPECT_NE(a, app::datasetFingerprint({"cat", "dog"}, 11, 4));
  EXPECT_EQ(a.substr(0, 10), "2 classes ");
}

// Two real processes that differ in one option: both exit within seconds (not the 60 s
// collective timeout) with the same one-line error naming the option and both values.
struct Mismatch {
  const char* name;
  const char* rank1_flags;
  const char* expected;
};
const Mismatch kMismatches[] = {
    {"AllreduceDtype", "--allreduce-dtype bf16", "--allreduce-dtype is bf16 on rank 1 but fp32 on rank 0"},
    {"Dataset", "--synthetic-images 160",
     "dataset is synthetic: 160 images, 4 classes on rank 1 but synthetic: 128 images, 4 classes on rank 0"},
    {"Streams", "--streams 3", "--streams is 3 on rank 1 but auto on rank 0"},
    {"LearningRate", "--lr 0.2", "--lr (per 256 images) is 0.2 on rank 1 but 0.1 on rank 0"},
};

class RanksStartedDifferently : public ::testing::TestWithParam<Mismatch> {};

TEST_P(RanksStartedDifferently, BothStopWithinSecondsNamingTheOption) {
  const Mismatch& m = GetParam();
  aiacc::test::TempDir d;
  const int port = aiacc::test::freePort();
  const std::string job = " --data synthetic --arch resnet18 --synthetic-classes 4 --batch-size 8 --image-size 32 "
                          "--epochs 1 --warmup-epochs 0 --threads 1 --max-steps 2 --comm-timeout 60 ";
  auto command = [&](int rank, const std::string& extra) {
    return "env AIACC_RANK=" + std::to_string(rank) + " AIACC_WORLD_SIZE=2 AIACC_LOCAL_RANK=" + std::to_string(rank) +
           " AIACC_LOCAL_SIZE=2 AIACC_MASTER=127.0.0.1:" + std::to_string(port) + " " + AIACC_TRAIN_BIN + job +
           (rank == 0 ? "--synthetic-images 128 " : "--synthetic-images 128 " + extra);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto [rc, out] = aiacc::test::runShell("(" + command(1, m.rank1_flags) + " > " + d.path() + "/log1 2>&1; echo $? > " +
                                         d.path() + "/rc1) & " + command(0, "") +
                                         " 2>&1; echo rc0=$?; wait; echo rc1=$(cat " + d.path() + "/rc1); cat " +
                                         d.path() + "/log1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(out.find("rc0=1"), std::string::npos) << out;
  EXPECT_NE(out.find("rc1=1"), std::string::npos) << out;
  // The same line from both ranks.
  const std::string line = std::string("aiacc_train: error: ranks were started with different settings: ") + m.expected;
  const size_t first = out.find(line);
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_NE(out.find(line, first + 1), std::string::npos) << out;
  EXPECT_LT(seconds, 45) << "well below the 60 s --comm-timeout: " << out;
}

INSTANTIATE_TEST_SUITE_P(Options, RanksStartedDifferently, ::testing::ValuesIn(kMismatches),
                         [](const ::testing::TestParamInfo<Mismatch>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace aiacc::comm
