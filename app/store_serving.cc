// The rendezvous store served beyond a job's own workers (app/store_serving.h).
#include "app/store_serving.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <optional>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "app/launch_env.h"
#include "app/stop_signal.h"
#include "aiacc/comm/membership.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"

namespace aiacc::app {
namespace {

// An elastic job's node 0, once its own workers ended: the other nodes' ranks may still train and
// regroup through the store this launcher serves. Serves until mayStopServing says it may (the
// job has ended and no process still waits to be let in: a survivor below MIN, a joiner; each
// must read how the job ended, not meet a closed store), or a stop signal (read from `sfd`).
void serveUntilTheJobEnds(const c10::intrusive_ptr<c10d::Store>& served, std::chrono::steady_clock::time_point until,
                          int sfd, bool restarts) {
  c10d::PrefixStore store(comm::StoreOptions{}.prefix, served);  // the workers' keys' prefix
  ServingFacts f;
  f.until = until;
  f.restarts = restarts;
  for (;;) {
    f.now = std::chrono::steady_clock::now();
    if (!f.ended && comm::jobEnded(store)) {
      f.ended = f.now;
      f.failed = comm::jobEndedHow(store) == comm::JobEnd::kFailed;
    }
    f.waiters = [&store] { return comm::waitersRemain(store); };
    if (mayStopServing(f)) return;
    pollfd p{sfd, POLLIN, 0};
    if (::poll(&p, 1, f.ended ? 10 : 100) > 0) {
      signalfd_siginfo si{};
      if (::read(sfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si)) && si.ssi_signo != SIGCHLD) {
        std::cerr << "aiacc_train: received " << signalName(static_cast<int>(si.ssi_signo))
                  << "; no longer serving the rendezvous store\n";
        return;
      }
    }
  }
}

}  // namespace

bool mayStopServing(const ServingFacts& f) {
  if (f.now >= f.until) return true;
  if (!f.ended) return false;
  if (f.now >= *f.ended + kWaitersGrace) return true;
  if (f.restarts && f.failed) return false;  // (the workers started again read the end)
  return !f.waiters || !f.waiters();
}

void keepStoreUntilTheJobEnds(const c10::intrusive_ptr<c10d::Store>& served, const LaunchSpec& spec, int sfd) {
  c10d::PrefixStore store(comm::StoreOptions{}.prefix, served);
  const bool restarts = spec.max_restarts > 0;
  if (comm::jobEnded(store)) {
    if (restarts && comm::jobEndedHow(store) == comm::JobEnd::kFailed) {
      std::cerr << "aiacc_train: the job failed on every rank; serving the rendezvous store "
                << std::chrono::duration_cast<std::chrono::seconds>(kWaitersGrace).count()
                << " s more for the workers the other nodes start again to read it\n";
    } else if (!comm::waitersRemain(store)) {
      return;
    } else {
      std::cerr << "aiacc_train: the job has ended; serving the rendezvous store until the processes still waiting "
                   "to regroup have read it\n";
    }
  } else {
    std::cerr << "aiacc_train: this node's workers have ended; serving the rendezvous store for the other nodes "
                 "until the job ends (at most --rdzv-timeout "
              << std::chrono::duration_cast<std::chrono::seconds>(spec.rdzv_timeout).count() << " s)\n";
  }
  serveUntilTheJobEnds(served, std::chrono::steady_clock::now() + spec.rdzv_timeout, sfd, restarts);
}

int serveRendezvous(const std::string& endpoint, std::chrono::milliseconds timeout) {
  const int port = parseHostPort(endpoint).second;
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGINT, SIGTERM}) sigaddset(&handled, sig);
  AIACC_CHECK(::pthread_sigmask(SIG_BLOCK, &handled, nullptr) == 0, "cannot block signals");
  const int sfd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  AIACC_CHECK(sfd >= 0, "signalfd failed: ", std::strerror(errno));
  // After the signals are blocked: the server's threads inherit the mask.
  const c10::intrusive_ptr<c10d::Store> served = comm::hostStore(port, 1, timeout);
  std::cerr << "aiacc_train: serving the rendezvous store on port " << port
            << " until a job it serves ends (or SIGTERM / SIGINT); its launchers name it with --rdzv-endpoint "
            << endpoint << "\n";
  // (The launchers' --max-restarts is theirs: after a failed end the store stays kWaitersGrace.)
  serveUntilTheJobEnds(served, std::chrono::steady_clock::time_point::max(), sfd, true);
  ::close(sfd);
  std::cerr << "aiacc_train: the rendezvous store on port " << port << " is closed\n";
  return 0;
}

}  // namespace aiacc::app
