// main() of the test executables that use comm: first the process-wide settings a program using
// comm makes at start-up (app/cli.h setUpProcess(): SIGPIPE ignored, so that a rank-thread whose
// peer closed its sockets gets a CommError instead of the whole binary dying; ProcessGroupNCCL's
// environment, comm/nccl_env.h), before any thread starts; then GoogleTest (tests/gtest_run.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>

#include "aiacc/comm/nccl_env.h"
#include "tests/gtest_run.h"

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  // The GPU tests' NCCL set-ups fail within seconds; a silent peer's then ends within 20 s.
  ::setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", "20", /*overwrite=*/0);
  for (const auto& e : aiacc::comm::kNcclEnvironment) ::setenv(e.name, e.value, /*overwrite=*/0);
  testing::InitGoogleTest(&argc, argv);
  return aiacc::test::runAllTests();  // (77 when every test skipped)
}
