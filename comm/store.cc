#include "aiacc/comm/store.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/comm/transport.h"
#include "aiacc/common/parse_number.h"

namespace aiacc::comm {

using namespace std::chrono_literals;

const char* const kJobKey = "aiacc/job";

namespace {

// A TCPStore at `port`: its server and a client of it (rank 0), or a client alone; throws what
// TCPStore throws (a port in use, nothing listening within `timeout`).
c10::intrusive_ptr<c10d::TCPStore> tcpStoreAt(const StoreOptions& o, int port, bool server,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = server;
  opts.numWorkers = static_cast<std::size_t>(o.world);
  opts.waitWorkers = false;  // we wait ourselves, with a message naming the missing ranks
  opts.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(o.host, opts);
  if (server) boundStalledRequests(*store, kStalledRequestBound);
  return store;
}

// Whether something accepts TCP connections at host:port within `wait` (one connect, closed at
// once).
bool listening(const std::string& host, int port, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof(error);
      ok = ::poll(&p, 1, static_cast<int>(wait.count())) == 1 &&
           ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return ok;
}

// The job a store was claimed for; "" when nobody claimed it within `wait` (a server that is not
// an aiacc job's store, or one whose rank 0 has not claimed it yet).
std::string ownerOf(c10d::Store& store, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!store.check({kJobKey})) {
    if (std::chrono::steady_clock::now() > deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<uint8_t> owner = store.get(kJobKey);
  return std::string(owner.begin(), owner.end());
}

// The last of a port search's ports, once o is checked for one.
int lastPort(const StoreOptions& o) {
  AIACC_CHECK_INPUT(!o.job.empty(), "StoreOptions::port_tries ", o.port_tries,
                    " needs StoreOptions::job: the ranks tell their store from another job's by it");
  const int last = o.port + o.port_tries - 1;
  AIACC_CHECK_INPUT(o.port >= 1 && last <= 65535, "StoreOptions: ports ", o.port, "-", last, " are not all in 1-65535");
  return last;
}

// The host's side of a port search: the server at the first of the ports it can bind, claimed
// for o.job at once.
c10::intrusive_ptr<c10d::TCPStore> hostAtFirstFree(const StoreOptions& o, const std::string& who) {
  const int last = lastPort(o);
  std::string why;
  for (int port = o.port; port <= last; ++port) {
    try {
      auto store = tcpStoreAt(o, port, /*server=*/true, o.timeout);
      claimForJob(*store, o.job, o.host + ":" + std::to_string(port));
      return store;
    } catch (const std::exception& e) {  // in use (another job's store, or anything else)
      why = firstLine(e.what());
    }
  }
  throw CommError(strCat(who, " cannot host the rendezvous store on any of ports ", o.port, "-", last, " (the last: ",
                         why, "); are ", o.port_tries, " other jobs on this node? give the store a port of its own"),
                  CommError::Remedy::kStore);
}

// port_tries > 1: rank 0 hosts at the first port it can bind and claims it at once (unless
// client_only: a launcher did so); the others look through the ports, round after round, for the
// store claimed for o.job.
c10::intrusive_ptr<c10d::Store> findTcpStore(const StoreOptions& o) {
  const int last = lastPort(o);
  if (o.rank == 0 && !o.client_only) return hostAtFirstFree(o, "rank 0");
  // A look at a port with nothing behind it is short (a refused or unanswered connect), and
  // rank 0 may take any of them. (TCPStore's own connect is no look: LibTorch 1.13 counts its
  // timeout in whole seconds, so a short one fails at once.)
  const auto look = std::min<std::chrono::milliseconds>(o.timeout, 250ms);
  // Then a TCPStore client, its connect bounded by at least 1 s (LibTorch 1.13 would make less 0 s).
  const auto connect = std::max<std::chrono::milliseconds>(1000ms,
                                                           std::min<std::chrono::milliseconds>(o.timeout, 5000ms));
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  std::vector<std::string> seen(static_cast<size_t>(o.port_tries));
  for (;;) {
    for (int port = o.port; port <= last; ++port) {
      std::string& there = seen[static_cast<size_t>(port - o.port)];
      if (!listening(o.host, port, look)) {
        there = "nothing listening";
        continue;
      }
      try {
        auto store = tcpStoreAt(o, port, /*server=*/false, connect);
        const std::string owner = ownerOf(*store, 1000ms);
        if (owner == o.job) {
          store->setTimeout(o.timeout);
          return store;
        }
        there = owner.empty() ? "a server that is not an aiacc job's store" : "job '" + owner + "'";
      } catch (const std::exception& e) {
        there = "a server that did not answer as a store (" + firstLine(e.what()) + ")";
      }
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string found;
  for (int i = 0; i < o.port_tries; ++i) found += strCat(i ? "; " : "", o.port + i, ": ", seen[static_cast<size_t>(i)]);
  throw CommError(strCat("cannot find the rendezvous store of job '", o.job, "' at ", o.host, ", ports ", o.port, "-",
                         last, ", within ", o.timeout.count() / 1000.0, " s (found ", found,
                         "); is rank 0 running, at the store's address?"),
                  CommError::Remedy::kStore);
}

}  // namespace

c10::intrusive_ptr<c10d::Store> storeUnderPrefix(const StoreOptions& o, c10::intrusive_ptr<c10d::Store> store) {
  if (o.key_log) return makeRecordingPrefixStore(o.prefix, std::move(store), o.key_log);
  return c10::make_intrusive<c10d::PrefixStore>(o.prefix, std::move(store));
}

c10::intrusive_ptr<c10d::Store> makeTcpStore(const StoreOptions& o) {
  if (o.port_tries > 1) return storeUnderPrefix(o, findTcpStore(o));
  const bool server = o.rank == 0 && !o.client_only;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = tcpStoreAt(o, o.port, server, o.timeout);
  } catch (const std::exception& e) {
    throw CommError(strCat(server ? "rank 0 cannot host the rendezvous store on port "
                                  : "cannot reach the rendezvous store at ",
                           server ? std::to_string(o.port) : o.host + ":" + std::to_string(o.port), " (",
                           firstLine(e.what()), "); ",
                           server          ? "is the port in use? give the store another port"
                           : o.client_only ? "is the launcher's agent (torchrun) still running?"
                                           : "is rank 0 running, at the store's address?"),
                    CommError::Remedy::kStore);
  }
  if (!o.job.empty()) claimForJob(*store, o.job, o.host + ":" + std::to_string(o.port));
  return storeUnderPrefix(o, std::move(store));
}

c10::intrusive_ptr<c10d::Store> hostStore(int port, int world, std::chrono::milliseconds timeout) {
  StoreOptions o;  // its own server, on every interface (host: the address its own client uses)
  o.world = world;
  try {
    return tcpStoreAt(o, port, /*server=*/true, timeout);
  } catch (const std::exception& e) {
    throw CommError(strCat("cannot host the rendezvous store on port ", port, " (", firstLine(e.what()),
                           "); is the port in use? give the store another port"),
                    CommError::Remedy::kStore);
  }
}

c10::intrusive_ptr<c10d::Store> hostJobStore(const StoreOptions& o) {
  StoreOptions own = o;  // (its own client: on this host)
  own.host = StoreOptions{}.host;
  return hostAtFirstFree(own, "this launcher");
}

// The server's sockets are found among this process's descriptors by their own port: the
// listening one, whose receive timeout Linux copies to each connection that completes its
// handshake from then on, and those it accepted before (their local port is the server's; the
// process's own clients of the store have ephemeral ones). Each then bounds the server's
// blocking reads.
void boundStalledRequests(const c10d::Store& server, std::chrono::milliseconds bound) {
  const int port = hostedPort(server);
  const timeval tv{static_cast<time_t>(bound.count() / 1000), static_cast<suseconds_t>(bound.count() % 1000 * 1000)};
  bool listener = false;
  for (const PortSocket& s : socketsOnPort(port)) {
    if (::setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0) listener = listener || s.listening;
  }
  if (!listener) {
    throw CommError(strCat("the rendezvous store's server on port ", port,
                           " has no listening socket in this process to bound its reads on (is /proc mounted?)"),
                    CommError::Remedy::kStore);
  }
}

std::vector<PortSocket> socketsOnPort(int port) {
  const auto portOf = [](const sockaddr_storage& a) {
    if (a.ss_family == AF_INET6) return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port));
    if (a.ss_family == AF_INET) return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port));
    return -1;
  };
  std::vector<PortSocket> found;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    const std::optional<int> fd = parseInteger<int>(it->path().filename().string());
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    int type = 0;
    socklen_t type_len = sizeof(type);
    if (!fd || ::getsockname(*fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 || portOf(local) != port ||
        ::getsockopt(*fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM) {
      continue;  // (not TCP: a UDP socket may hold the same number)
    }
    PortSocket s;
    s.fd = *fd;
    int listening = 0;
    socklen_t len = sizeof(listening);
    s.listening = ::getsockopt(*fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    if (!s.listening && ::getpeername(*fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0)
      s.peer_port = portOf(peer);
    found.push_back(s);
  }
  return found;
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
