// aiacc_peer_rank TRANSPORT HOST PORT RANK WORLD [silent] [name=NAME]: one rank of a CPU
// transport (shm or gloo) in a process of its own, for the liveness tests
// (tests/liveness_test.cc), which kill or stop it. It meets the test's TCPStore at HOST:PORT,
// joins the transport, then takes part in nothing: it waits to be killed, stopped, or orphaned
// (it dies with its parent, and after 5 minutes in any case). `silent` (shm): it sends no
// heartbeat, as a process whose heartbeat thread gets no core would. `name=NAME` (shm): the
// transport's name (ShmOptions::name: its store keys and segment names), default "shm".
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "aiacc/config.h"
#include "aiacc/comm/shm_transport.h"
#if AIACC_WITH_GLOO
#include "aiacc/comm/gloo_transport.h"
#endif

int main(int argc, char** argv) {
  bool silent = false;
  std::string name = "shm";
  bool usage = argc < 6;
  for (int i = 6; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "silent") {
      silent = true;
    } else if (a.rfind("name=", 0) == 0) {
      name = a.substr(5);
    } else {
      usage = true;
    }
  }
  if (usage) {
    std::fprintf(stderr, "usage: aiacc_peer_rank shm|gloo HOST PORT RANK WORLD [silent] [name=NAME]\n");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::alarm(300);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(std::stoi(argv[3]));
    so.isServer = false;
    so.timeout = std::chrono::seconds(60);
    auto store = c10::make_intrusive<c10d::TCPStore>(argv[2], so);
    const std::string transport = argv[1];
    const int rank = std::stoi(argv[4]), world = std::stoi(argv[5]);
    std::unique_ptr<aiacc::comm::Transport> t;
    if (transport == "shm") {
      aiacc::comm::ShmOptions o;
      o.rank = rank;
      o.world = world;
      o.timeout = std::chrono::seconds(60);
      o.name = name;
      if (silent) o.heartbeat_timeout = std::chrono::milliseconds(0);  // no heartbeat thread
      t = std::make_unique<aiacc::comm::ShmTransport>(store, o);
#if AIACC_WITH_GLOO
    } else if (transport == "gloo") {
      aiacc::comm::GlooOptions o;
      o.rank = rank;
      o.world = world;
      o.timeout = std::chrono::seconds(60);
      t = std::make_unique<aiacc::comm::GlooTransport>(store, o);
#endif
    } else {
      std::fprintf(stderr, "aiacc_peer_rank: no transport '%s' in this build\n", argv[1]);
      return 2;
    }
    for (;;) ::pause();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aiacc_peer_rank: %s\n", e.what());
    return 1;
  }
}
