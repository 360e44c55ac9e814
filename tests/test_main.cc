// main() of the test executables that use comm: first the process-wide settings a program using
// comm makes at start-up (app/cli.h setUpProcess(): SIGPIPE ignored, so that a rank-thread whose
// peer closed its sockets gets a CommError instead of the whole binary dying; ProcessGroupNCCL's
// environment, comm/nccl_env.h), before any thread starts; then GoogleTest.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>

#include "aiacc/comm/nccl_env.h"

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  // The GPU tests' NCCL set-ups fail within seconds; a silent peer's then ends within 20 s.
  ::setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", "20", /*overwrite=*/0);
  for (const auto& e : aiacc::comm::kNcclEnvironment) ::setenv(e.name, e.value, /*overwrite=*/0);
  // Workaround, not a fix (issue 26): on a CPU with AMX, LibTorch 1.13's oneDNN bf16 kernels on
  // AMX turn TrainE2E.MixedPrecisionTracksFp32 to NaN at a random step under load (9 of 24 runs
  // beside two busy loops; 0 of 24 with oneDNN kept below AMX). Kept below AMX in the tests until
  // the cause is shown outside aiacc and aiacc_train itself decides.
  ::setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", /*overwrite=*/0);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
