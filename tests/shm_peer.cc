// aiacc_shm_peer HOST PORT RANK WORLD: one rank of a shared-memory transport in a process of its
// own, for the liveness tests (tests/liveness_test.cc), which kill or stop it. It meets the test's
// TCPStore at HOST:PORT, joins the ShmTransport, then takes part in nothing: it waits to be
// killed, stopped, or orphaned (it dies with its parent, and after 5 minutes in any case).
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "aiacc/comm/shm_transport.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: aiacc_shm_peer HOST PORT RANK WORLD\n");
    return 2;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::alarm(300);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(std::stoi(argv[2]));
    so.isServer = false;
    so.timeout = std::chrono::seconds(60);
    auto store = c10::make_intrusive<c10d::TCPStore>(argv[1], so);
    aiacc::comm::ShmOptions o;
    o.rank = std::stoi(argv[3]);
    o.world = std::stoi(argv[4]);
    o.timeout = std::chrono::seconds(60);
    aiacc::comm::ShmTransport shm(store, o);
    for (;;) ::pause();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aiacc_shm_peer: %s\n", e.what());
    return 1;
  }
}
