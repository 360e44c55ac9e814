// main()'s last call in every test executable: RUN_ALL_TESTS(), whose exit code also tells a run
// in which every test skipped (GTEST_SKIP: no GPU, no Slurm, ...) from one that passed: 77, the
// SKIP_RETURN_CODE cmake/GTestGroups.cmake gives each CTest test, so that ctest shows it skipped.
// A run where some tests pass and the others skip passes (0); a failure stays 1, and so is a
// --gtest_filter that selects no test (a suite renamed under a stale list, a typo).
#pragma once

#include <gtest/gtest.h>

#include <iostream>

namespace aiacc::test {

constexpr int kExitAllSkipped = 77;

inline int runAllTests() {
  const int rc = RUN_ALL_TESTS();
  if (rc != 0 || GTEST_FLAG_GET(list_tests)) return rc;
  const testing::UnitTest& u = *testing::UnitTest::GetInstance();
  if (u.test_to_run_count() == 0) {
    std::cerr << "no test matches --gtest_filter=" << GTEST_FLAG_GET(filter) << "\n";
    return 1;
  }
  if (u.skipped_test_count() > 0 && u.successful_test_count() == 0) return kExitAllSkipped;
  return rc;
}

}  // namespace aiacc::test
