#include "comm/store.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

#include "comm/transport.h"

namespace aiacc::comm {

c10::intrusive_ptr<c10d::Store> makeTcpStore(const StoreOptions& o) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(o.port);
  const bool server = o.rank == 0 && !o.client_only;
  opts.isServer = server;
  opts.numWorkers = static_cast<std::size_t>(o.world);
  opts.waitWorkers = false;  // we wait ourselves, with a message naming the missing ranks
  opts.timeout = o.timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(o.host, opts);
    return c10::make_intrusive<c10d::PrefixStore>(o.prefix, store);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    AIACC_THROW(CommError, server ? "rank 0 cannot host the rendezvous store on port "
                                  : "cannot reach the rendezvous store at ",
                server ? std::to_string(o.port) : o.host + ":" + std::to_string(o.port),
                " (", what, "); ", server ? "is the port in use? pick another with --master"
                                   : o.client_only ? "is the launcher's agent (torchrun) still running?"
                                                   : "is rank 0 running?");
  }
}

c10::intrusive_ptr<c10d::Store> makeHashStore() { return c10::make_intrusive<c10d::HashStore>(); }

void waitForRanks(c10d::Store& store, const std::string& what, int world,
                  std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::string missing;
    int n_missing = 0;
    for (int r = 0; r < world; ++r) {
      if (!store.check({what + "/" + std::to_string(r)})) {
        if (n_missing++ < 16) missing += (missing.empty() ? "" : ",") + std::to_string(r);
      }
    }
    if (n_missing == 0) return;
    if (std::chrono::steady_clock::now() > deadline) {
      AIACC_THROW(CommError, "timed out after ", timeout.count() / 1000.0, " s waiting for '",
                  what, "' from rank(s) ", missing, n_missing > 16 ? ",..." : "", " (", n_missing,
                  " of ", world, " missing)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace aiacc::comm
