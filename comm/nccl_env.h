// The ProcessGroupNCCL settings NcclTransport (GPU ranks) is built for.
// PyTorch reads them from the environment when a process group is made; there is no option field
// for them. A library must not change a process's environment (setenv races getenv in threads
// already running, such as data loaders), so a program sets them itself at start-up, before it
// starts threads, keeping values the user set:
//
//   for (const auto& e : aiacc::comm::kNcclEnvironment) ::setenv(e.name, e.value, /*overwrite=*/0);
//
// aiacc_train's main() does. NcclTransport works without them, less well; ncclEnvironmentNotes()
// says how (NcclTransport logs it through NcclOptions::log). Header-only; no NCCL needed.
#pragma once

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace aiacc::comm {

struct EnvSetting {
  const char* name;
  const char* value;
  const char* otherwise;  // what happens with another value, or none
};

inline constexpr EnvSetting kNcclEnvironment[] = {
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2",
     "a failed or timed-out operation may end the process from ProcessGroupNCCL's watchdog (3, PyTorch's "
     "default) instead of reaching the host as a CommError"},
    {"TORCH_NCCL_PROPAGATE_ERROR", "1", "a rank's failure does not reach the other ranks through the store"},
    {"TORCH_NCCL_USE_COMM_NONBLOCKING", "1", "communicator set-up waits in NCCL without any timeout"},
    // Non-blocking set-up and teardown wait this many seconds for the communicator (PyTorch's
    // default: 30 minutes), whatever NcclOptions::timeout says: seen on an H200, a set-up whose
    // peer went silent held the caller past a minute. Read once per process; 60 is kDefaultTimeout.
    {"TORCH_NCCL_NONBLOCKING_TIMEOUT", "60",
     "a communicator whose set-up or teardown never completes (a peer gone silent) holds its caller for "
     "PyTorch's 30 minutes instead of failing"},
    {"TORCH_NCCL_ENABLE_TIMING", "1",
     "operations are not timed: channels report no busy time, and striping cannot balance them by speed"},
};

// One line per setting of kNcclEnvironment whose value differs (unset included), saying what
// that means; `get` reads a variable (default: the process's environment), null when unset.
inline std::vector<std::string> ncclEnvironmentNotes(const std::function<const char*(const char*)>& get =
                                                         [](const char* name) { return std::getenv(name); }) {
  std::vector<std::string> notes;
  for (const EnvSetting& e : kNcclEnvironment) {
    const char* v = get(e.name);
    if (v && std::strcmp(v, e.value) == 0) continue;
    notes.push_back(std::string(e.name) + (v ? "=" + std::string(v) : std::string(" is unset")) +
                    " (NcclTransport expects " + e.value + "): " + e.otherwise);
  }
  return notes;
}

}  // namespace aiacc::comm
