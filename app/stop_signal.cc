#include "app/stop_signal.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "aiacc/common/error.h"

namespace aiacc::app {
namespace {

// Written by the handler, read by the training thread (lock-free: async-signal-safe).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void onStopSignal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);  // the first one is what the log names
}

}  // namespace

void installStopSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) {
    AIACC_CHECK(::sigaction(sig, &sa, nullptr) == 0, "cannot install the handler for ", signalName(sig), ": ",
                std::strerror(errno));
  }
}

void stopWhenParentDies() {
  const pid_t parent = ::getppid();
  AIACC_CHECK(::prctl(PR_SET_PDEATHSIG, SIGUSR1) == 0, "prctl(PR_SET_PDEATHSIG): ", std::strerror(errno));
  if (::getppid() != parent) ::raise(SIGUSR1);  // it died before the call took effect
}

int stopSignalReceived() { return g_stop_signal.load(std::memory_order_relaxed); }

std::string signalName(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGKILL: return "SIGKILL";
    default: return strCat("signal ", sig);
  }
}

}  // namespace aiacc::app
