// main() of the data tests: GoogleTest, with tests/gtest_run.h's exit code.
#include <gtest/gtest.h>

#include "tests/gtest_run.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return aiacc::test::runAllTests();
}
