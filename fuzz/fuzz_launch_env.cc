// The launcher environment on any bytes: lines NAME=VALUE become the variables torchrun, Slurm,
// Open MPI, MPICH, Horovod, Kubeflow and aiacc's own launcher set (comm/launch_env.h), read by
// detectLaunch and planned into this process's role (app/launch_env.h, with default flags). A
// malformed or inconsistent set is a one-line InputError naming the variables.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "aiacc/comm/launch_env.h"
#include "aiacc/common/error.h"
#include "app/launch_env.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  aiacc::comm::EnvMap env;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  try {
    const aiacc::comm::LaunchEnv le = aiacc::comm::detectLaunch(env);
    aiacc::app::planLaunch(le, aiacc::app::LaunchFlags{});
    aiacc::comm::defaultJobId(le);
  } catch (const aiacc::InputError& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
