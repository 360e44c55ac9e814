#include "aiacc/comm/store.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <thread>

#include "aiacc/comm/transport.h"

namespace aiacc::comm {

const char* const kJobKey = "aiacc/job";

c10::intrusive_ptr<c10d::Store> makeTcpStore(const StoreOptions& o) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(o.port);
  const bool server = o.rank == 0 && !o.client_only;
  opts.isServer = server;
  opts.numWorkers = static_cast<std::size_t>(o.world);
  opts.waitWorkers = false;  // we wait ourselves, with a message naming the missing ranks
  opts.timeout = o.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(o.host, opts);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw CommError(strCat(server ? "rank 0 cannot host the rendezvous store on port "
                                  : "cannot reach the rendezvous store at ",
                           server ? std::to_string(o.port) : o.host + ":" + std::to_string(o.port), " (", what, "); ",
                           server          ? "is the port in use? give the store another port"
                           : o.client_only ? "is the launcher's agent (torchrun) still running?"
                                           : "is rank 0 running, at the store's address?"),
                    CommError::Remedy::kStore);
  }
  if (!o.job.empty()) claimForJob(*store, o.job, o.host + ":" + std::to_string(o.port));
  if (o.key_log) return makeRecordingPrefixStore(o.prefix, store, o.key_log);
  return c10::make_intrusive<c10d::PrefixStore>(o.prefix, store);
}

c10::intrusive_ptr<c10d::Store> hostStore(int port, int world, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = true;
  opts.numWorkers = static_cast<std::size_t>(world);
  opts.waitWorkers = false;
  opts.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  } catch (const std::exception& e) {
    throw CommError(strCat("cannot host the rendezvous store on port ", port, " (", firstLine(e.what()),
                           "); is the port in use? give the store another port"),
                    CommError::Remedy::kStore);
  }
}

int hostedPort(const c10d::Store& store) {
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(&store);
  AIACC_CHECK(tcp != nullptr, "hostedPort: not a TCPStore");
  return tcp->getPort();
}

void claimForJob(c10d::Store& store, const std::string& job, const std::string& where) {
  const std::vector<uint8_t> mine(job.begin(), job.end());
  const std::vector<uint8_t> owner = store.compareSet(kJobKey, {}, mine);
  if (owner == mine) return;
  throw CommError(strCat("the rendezvous store at ", where, " belongs to another job ('",
                         std::string(owner.begin(), owner.end()), "'; this process is job '", job,
                         "'): two jobs share the port; give this job a store port of its own (or every rank the "
                         "same job id)"),
                  CommError::Remedy::kStore);
}

c10::intrusive_ptr<c10d::Store> makeHashStore() { return c10::make_intrusive<c10d::HashStore>(); }

// One check() of every key per poll: each rank polling costs the store (rank 0's) one request,
// not one per rank. Only on a timeout are the keys looked at one by one, to name the missing.
void waitForRanks(c10d::Store& store, const std::string& what, int world, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(what + "/" + std::to_string(r));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  const std::chrono::milliseconds longest = waitForRanksLongestPause(world);
  while (!store.check(keys)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      int n_missing = 0;
      for (int r = 0; r < world; ++r) {
        if (store.check({keys[static_cast<size_t>(r)]})) continue;
        if (n_missing++ < 16) missing += (missing.empty() ? "" : ",") + std::to_string(r);
      }
      if (n_missing == 0) return;  // the last arrived just now
      AIACC_THROW(CommError, "timed out after ", timeout.count() / 1000.0, " s waiting for '", what, "' from rank(s) ",
                  missing, n_missing > 16 ? ",..." : "", " (", n_missing, " of ", world, " missing)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, longest);
  }
}

std::chrono::milliseconds waitForRanksLongestPause(int world) {
  return std::chrono::milliseconds(std::clamp(world / 10, 20, 200));
}

}  // namespace aiacc::comm
