// The test hooks a real aiacc_train_hooked process reads from its environment (app/test_hooks.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/common/error.h"
#include "app/test_hooks.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

// The test hooks a real process reads from its environment, each said in a note; none when unset;
// a malformed AIACC_TEST_HOLD_CHECKPOINT is an InputError naming the variable.
TEST(TestHooks, ReadFromTheEnvironmentOnceAndSaid) {
  std::map<std::string, std::string> env;
  auto get = [&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  TestHooks h = testHooksFromEnvironment(get);
  EXPECT_TRUE(h.step_vote);
  EXPECT_FALSE(h.checkpoint);
  EXPECT_EQ(h.sample_log, "");
  EXPECT_TRUE(h.notes.empty());
  env = {
      {"AIACC_BENCH_NO_STEP_VOTE", "1"}, {"AIACC_TEST_SAMPLE_LOG", "/tmp/s"}, {"AIACC_TEST_HOLD_CHECKPOINT", "4:/x"}};
  h = testHooksFromEnvironment(get);
  EXPECT_FALSE(h.step_vote);
  EXPECT_TRUE(h.checkpoint);
  EXPECT_EQ(h.sample_log, "/tmp/s");
  EXPECT_EQ(h.notes.size(), 2u);
  env = {{"AIACC_TEST_HOLD_CHECKPOINT", "four"}};
  try {
    testHooksFromEnvironment(get);
    ADD_FAILURE() << "a malformed hold was taken";
  } catch (const aiacc::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("AIACC_TEST_HOLD_CHECKPOINT must be STEP:FILE"), std::string::npos);
  }
  EXPECT_EQ(h.step_vote_ab, 0);
  env = {{"AIACC_BENCH_STEP_VOTE_AB", "3"}};
  h = testHooksFromEnvironment(get);
  EXPECT_TRUE(h.step_vote);
  EXPECT_EQ(h.step_vote_ab, 3);
  EXPECT_EQ(h.notes.size(), 1u);
  EXPECT_TRUE(h.survivor_save);
  env = {{"AIACC_BENCH_NO_SURVIVOR_SAVE", "1"}};
  h = testHooksFromEnvironment(get);
  EXPECT_FALSE(h.survivor_save);
  EXPECT_EQ(h.notes.size(), 1u);
  env = {{"AIACC_TEST_LATE_TO_REGROUP_MS", "1500"}};
  h = testHooksFromEnvironment(get);
  EXPECT_EQ(h.late_to_regroup_ms, 1500);
  EXPECT_EQ(h.notes.size(), 1u);
  EXPECT_EQ(h.die_joining, JoinDeath::kNone);
  env = {{"AIACC_TEST_DIE_JOINING", "restore"}};
  h = testHooksFromEnvironment(get);
  EXPECT_EQ(h.die_joining, JoinDeath::kRestore);
  EXPECT_EQ(h.notes.size(), 1u);
  env = {{"AIACC_TEST_DIE_JOINING", "settings"}};
  EXPECT_EQ(testHooksFromEnvironment(get).die_joining, JoinDeath::kSettings);
  EXPECT_FALSE(h.step_end);
  env = {{"AIACC_TEST_FAIL_AT_STEP", "*:3"}, {"AIACC_TEST_FAIL_SETUP", "2"}};
  h = testHooksFromEnvironment(get);
  ASSERT_TRUE(h.step_end);
  EXPECT_NO_THROW(h.step_end(0, 2));
  EXPECT_THROW(h.step_end(0, 3), aiacc::Error);
  EXPECT_THROW(h.step_end(5, 3), aiacc::Error);
  EXPECT_EQ(h.fail_setups, 2);
  EXPECT_EQ(h.notes.size(), 2u);
  // A hold after step 2, beside rank 1's fault after step 4: each process says it is held (FILE.held.<pid>)
  // and goes on once FILE exists.
  test::TempDir d;
  const std::string release = d / "release";
  env = {{"AIACC_TEST_FAIL_AT_STEP", "1:4"}, {"AIACC_TEST_HOLD_AT_STEP", "2:" + release}};
  h = testHooksFromEnvironment(get);
  EXPECT_EQ(h.fail_setups, 0);
  EXPECT_EQ(h.notes.size(), 2u);
  EXPECT_NO_THROW(h.step_end(0, 4));
  EXPECT_THROW(h.step_end(1, 4), aiacc::Error);
  // Runs `step_end` on a thread, which must say it is held (FILE.held.<pid>, within 60 s), then
  // lets it go (FILE) and waits for it.
  auto heldThenGone = [](const std::function<void()>& step_end, const std::string& file, const char* what) {
    std::thread held(step_end);
    const std::string marker = file + ".held." + std::to_string(::getpid());
    for (int i = 0; i < 60000 && !std::filesystem::exists(marker); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(std::filesystem::exists(marker)) << what;
    test::writeText(file, "");
    held.join();
  };
  heldThenGone([&] { h.step_end(1, 2); }, release, "the held thread says so");
  EXPECT_NO_THROW(h.step_end(1, 3));  // (no marker written, nothing waited for)
  // A list of holds: each at its own step, with its own file.
  const std::string later = d / "later";
  env = {{"AIACC_TEST_HOLD_AT_STEP", "2:" + release + ",5:" + later}};
  h = testHooksFromEnvironment(get);
  EXPECT_NO_THROW(h.step_end(0, 2));  // (released already)
  heldThenGone([&] { h.step_end(0, 5); }, later, "held at the list's second step");
  for (const auto& bad : std::vector<std::map<std::string, std::string>>{
           {{"AIACC_TEST_DIE_JOINING", "later"}},
           {{"AIACC_TEST_FAIL_SETUP", "0"}},
           {{"AIACC_TEST_FAIL_AT_STEP", "**:3"}},
           {{"AIACC_TEST_FAIL_AT_STEP", "*"}},
           {{"AIACC_TEST_HOLD_AT_STEP", "3"}},
           {{"AIACC_TEST_HOLD_AT_STEP", "3:"}},
           {{"AIACC_TEST_HOLD_AT_STEP", "0:/x"}},
           {{"AIACC_TEST_HOLD_AT_STEP", "2:/x,"}},
           {{"AIACC_TEST_HOLD_AT_STEP", "2:/x,,3:/y"}},
           {{"AIACC_TEST_HOLD_CHECKPOINT", "x:/y"}},
           {{"AIACC_TEST_LATE_TO_REGROUP_MS", "0"}},
           {{"AIACC_TEST_LATE_TO_REGROUP_MS", "1s"}},
           {{"AIACC_BENCH_STEP_VOTE_AB", "0"}},
           {{"AIACC_BENCH_STEP_VOTE_AB", "2x"}},
           {{"AIACC_BENCH_STEP_VOTE_AB", ""}},
           {{"AIACC_BENCH_STEP_VOTE_AB", "2"}, {"AIACC_BENCH_NO_STEP_VOTE", "1"}}}) {
    env = bad;
    EXPECT_THROW(testHooksFromEnvironment(get), aiacc::InputError) << env.begin()->second;
  }
}

}  // namespace
}  // namespace aiacc::app
