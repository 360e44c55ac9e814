// comm/store.h: the rendezvous store. Its TCP server on a free loopback port and ranks as threads
// of this process; the claim of a store for its job, the search for it over several ports (a
// port derived from a job id, which another job on the node may hold), and the wait for ranks.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/comm/store.h"
#include "aiacc/comm/transport.h"
#include "aiacc/common/error.h"
#include "tests/test_util.h"

namespace aiacc::comm {
namespace {

using namespace std::chrono_literals;

// `n` consecutive loopback ports nobody listens on now, from the kernel's pick for port 0.
int freePorts(int n) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int first = aiacc::test::freePort();
    bool all = first > 0 && first + n <= 65535;
    for (int p = first + 1; all && p < first + n; ++p) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(p));
      all = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      ::close(fd);
    }
    if (all) return first;
  }
  ADD_FAILURE() << "no " << n << " consecutive free ports";
  return 0;
}

// A TCPStore server that is no aiacc job's store: nobody claims it.
c10::intrusive_ptr<c10d::TCPStore> foreignServer(int port) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = true;
  o.numWorkers = 1;
  o.waitWorkers = false;
  o.timeout = 5s;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

// `port` held by job A's store, port + 1 by a server that is no aiacc store.
struct TakenPorts {
  explicit TakenPorts(int port) {
    a.port = port;
    a.world = 1;
    a.job = "job-a";
    a.timeout = 5s;
    first = makeTcpStore(a);
    foreign = foreignServer(port + 1);
  }
  StoreOptions a;
  c10::intrusive_ptr<c10d::Store> first;
  c10::intrusive_ptr<c10d::TCPStore> foreign;
};

// Whether anything accepts connections at the loopback `port`.
bool listening(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// A job of 2 ranks whose store may be at any of `taken`'s port and the next 3.
StoreOptions searchingPorts(const TakenPorts& taken, const std::string& job) {
  StoreOptions o = taken.a;
  o.job = job;
  o.world = 2;
  o.port_tries = 4;
  o.timeout = 20s;
  return o;
}

// Rank 1 of `o`'s job, looking for its store in a thread of its own: the store, or its error.
std::future<c10::intrusive_ptr<c10d::Store>> rankOneLooking(StoreOptions o) {
  o.rank = 1;
  return std::async(std::launch::async, [o] { return makeTcpStore(o); });
}

// What the store at `port` was claimed for (its unprefixed job key).
std::string ownerAt(int port) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.timeout = 5s;
  c10d::TCPStore store("127.0.0.1", o);
  const std::vector<uint8_t> v = store.get("aiacc/job");
  return std::string(v.begin(), v.end());
}

TEST(Store, PortInUseIsAClearError) {
  StoreOptions o;
  o.port = aiacc::test::freePort();
  o.world = 1;
  o.timeout = std::chrono::seconds(5);
  auto first = makeTcpStore(o);
  try {
    auto second = makeTcpStore(o);
    FAIL() << "second server on the same port";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(strCat("port ", o.port)), std::string::npos) << e.what();
  }
}

// Clients that sent part of a request and fell silent, their sockets open (as ones whose link
// went down between two of their writes), do not hold the other clients' requests: the server
// drops each once it has been silent for the bound, one connected before the bound was set as
// well as one after. (LibTorch 1.13's server waited for the rest for as long as a connection
// stayed open, and the other client's request timed out.)
TEST(Store, ClientsSilentInTheMiddleOfARequestHoldNoOtherClient) {
  const auto server = hostStore(0, 1, 5s);  // (bound: kStalledRequestBound, 5 s)
  const int port = hostedPort(*server);
  struct Silent {  // a connection that begins a request (2 bytes of it); closed when the test ends
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    bool connected = false;
    explicit Silent(int port) {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(port));
      connected = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    }
    ~Silent() { ::close(fd); }
    bool begin() const {
      const uint8_t partial[] = {0, 5};  // a query's type (1.13: a set) and 1 of its key length's 8 bytes
      return ::send(fd, partial, sizeof(partial), 0) == static_cast<ssize_t>(sizeof(partial));
    }
  };
  const Silent before(port);  // accepted before the bound is set (its reads would wait 5 s)
  ASSERT_TRUE(before.connected);
  // Until the server has accepted it: this process then holds the server's end (local port
  // `port`, peer port `before`'s own), which the scan, not the listener, bounds.
  sockaddr_in mine{};
  socklen_t mine_len = sizeof(mine);
  ASSERT_EQ(::getsockname(before.fd, reinterpret_cast<sockaddr*>(&mine), &mine_len), 0);
  auto accepted = [&] {
    const std::vector<PortSocket> sockets = socketsOnPort(port);
    return std::any_of(sockets.begin(), sockets.end(),
                       [&](const PortSocket& s) { return s.peer_port == ntohs(mine.sin_port); });
  };
  for (int i = 0; i < 10000 && !accepted(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(accepted()) << "the server did not accept a connection within 10 s";
  boundStalledRequests(*server, 200ms);
  const Silent after(port);
  ASSERT_TRUE(after.connected && before.begin() && after.begin());
  auto other = std::async(std::launch::async, [port] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.timeout = 3s;
    c10d::TCPStore store("127.0.0.1", o);
    store.set("k", {1, 2});
    return store.get("k");
  });
  // (3 s: 15 times the bound, and less than the 5 s that `before` had. Unbounded, the other
  // client's request waits for as long as the silent sockets stay open: shutting them then lets
  // the server, and the test, go on.)
  const bool served = other.wait_for(3s) == std::future_status::ready;
  ::shutdown(before.fd, SHUT_RDWR);
  ::shutdown(after.fd, SHUT_RDWR);
  EXPECT_TRUE(served) << "the other client's request waited on a silent one's";
  EXPECT_EQ(other.get(), (std::vector<uint8_t>{1, 2}));
}

// The first process claims the store for its job; one of another job is refused, naming both.
TEST(Store, AnotherJobIsRefused) {
  auto store = makeHashStore();
  claimForJob(*store, "job-a", "here");
  claimForJob(*store, "job-a", "here");  // a second rank of the same job
  try {
    claimForJob(*store, "job-b", "127.0.0.1:1234");
    FAIL() << "a process of another job was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("the rendezvous store at 127.0.0.1:1234 belongs to another job ('job-a'; "
                                         "this process is job 'job-b')"),
              std::string::npos)
        << e.what();
  }
}

TEST(Store, WaitNamesTheMissingRanks) {
  auto store = makeHashStore();
  store->set("ready/0", std::vector<uint8_t>{1});
  store->set("ready/2", std::vector<uint8_t>{1});
  try {
    waitForRanks(*store, "ready", 4, std::chrono::milliseconds(200));
    FAIL() << "missing ranks not reported";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1,3"), std::string::npos) << e.what();
  }
}

// Every rank polls with one request for all the keys, not one per rank (rank 0's store served
// O(world^2) requests every 20 ms).
class CountingStore : public c10d::HashStore {
 public:
  bool check(const std::vector<std::string>& keys) override {
    if (++requests == 3) set("ready/7", std::vector<uint8_t>{1});  // the last rank arrives during the third poll
    if (keys.size() > 1) ++polls;
    return c10d::HashStore::check(keys);
  }
  int requests = 0;
  int polls = 0;  // checks of every key at once
};

TEST(Store, WaitPollsWithOneRequestPerPoll) {
  auto store = c10::make_intrusive<CountingStore>();
  for (int r = 0; r < 7; ++r) store->set("ready/" + std::to_string(r), std::vector<uint8_t>{1});
  waitForRanks(*store, "ready", 8, std::chrono::seconds(30));
  EXPECT_EQ(store->requests, 3);
}

// The polls back off: 1, 2, 4 ... ms up to the longest pause, so a rank waiting 1 s asks at most
// ~log2(longest) + 1 s / longest times (a loaded machine only sleeps longer: fewer polls), and the
// longest pause grows with the world, bounding the store's load.
TEST(Store, WaitBacksOffToALongestPauseThatGrowsWithTheWorld) {
  EXPECT_EQ(waitForRanksLongestPause(2).count(), 20);
  EXPECT_EQ(waitForRanksLongestPause(512).count(), 51);
  EXPECT_EQ(waitForRanksLongestPause(4096).count(), 200);
  // 4096 ranks: 1+2+...+128 ms (8 polls), then 200 ms pauses: at most 8 + 750 / 200 + the last
  // poll in a second (polling every 20 ms, as before, asked 50 times).
  auto store = c10::make_intrusive<CountingStore>();
  try {
    waitForRanks(*store, "never", 4096, std::chrono::seconds(1));
    FAIL() << "nobody came, and no timeout";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("4096 of 4096 missing"), std::string::npos) << e.what();
  }
  EXPECT_LE(store->polls, 8 + 4 + 1);
  EXPECT_GE(store->polls, 2);
}

// Two jobs on one node whose ids give one port (mpirun's, Slurm's): the second's rank 0 hosts its
// store at the next port it can bind, passing over the first job's store and a server that is no
// aiacc store; its other rank, started first, finds it there. Each rank gets the same store.
TEST(Store, ASecondJobOnATakenPortHostsAtTheNextAndItsRanksFindIt) {
  const int port = freePorts(4);
  ASSERT_GT(port, 0);
  const TakenPorts taken(port);
  const StoreOptions b = searchingPorts(taken, "job-b");
  auto rank1 = rankOneLooking(b);
  std::this_thread::sleep_for(300ms);  // rank 1 looks before rank 0 hosts
  c10::intrusive_ptr<c10d::Store> stores[2];
  stores[0] = makeTcpStore(b);
  stores[1] = rank1.get();
  EXPECT_EQ(ownerAt(port), "job-a");
  // The first port of its 4 that rank 0 could bind: port + 2, unless another process of this
  // machine took that one meanwhile (the kernel hands out ports of this range to connections).
  const int at = listening(port + 2) ? port + 2 : port + 3;
  EXPECT_EQ(ownerAt(at), "job-b");
  stores[1]->set("hello", std::vector<uint8_t>{42});
  EXPECT_EQ(stores[0]->get("hello"), std::vector<uint8_t>{42});
  EXPECT_FALSE(taken.first->check({"hello"}));
}

// A rank that finds no store of its job within the timeout says what each port held.
TEST(Store, ARankThatFindsNoStoreOfItsJobSaysWhatEachPortHeld) {
  const int port = freePorts(3);
  ASSERT_GT(port, 0);
  const TakenPorts taken(port);
  StoreOptions c = taken.a;
  c.job = "job-c";
  c.rank = 1;
  c.world = 2;
  c.port_tries = 3;
  c.timeout = 1500ms;
  const std::string e = aiacc::test::messageOf<CommError>([&] { makeTcpStore(c); });
  EXPECT_NE(e.find(strCat("cannot find the rendezvous store of job 'job-c' at 127.0.0.1, ports ", port, "-", port + 2,
                          ", within 1.5 s (found ", port, ": job 'job-a'; ", port + 1,
                          ": a server that is not an aiacc job's store; ", port + 2, ": nothing listening)")),
            std::string::npos)
      << e;
}

// Rank 0 with every port of its job taken says so; a search needs a job to tell stores apart.
TEST(Store, RankZeroWithEveryPortTakenSaysSo) {
  const int port = freePorts(2);
  ASSERT_GT(port, 0);
  auto foreign0 = foreignServer(port);
  auto foreign1 = foreignServer(port + 1);
  StoreOptions o;
  o.port = port;
  o.world = 2;
  o.job = "job-d";
  o.port_tries = 2;
  o.timeout = 5s;
  const std::string e = aiacc::test::messageOf<CommError>([&] { makeTcpStore(o); });
  EXPECT_NE(e.find(strCat("rank 0 cannot host the rendezvous store on any of ports ", port, "-", port + 1)),
            std::string::npos)
      << e;
  o.job = "";
  const std::string no_job = aiacc::test::messageOf<InputError>([&] { makeTcpStore(o); });
  EXPECT_NE(no_job.find("needs StoreOptions::job"), std::string::npos) << no_job;
  o.job = "job-d";
  const std::string launcher = aiacc::test::messageOf<CommError>([&] { hostJobStore(o); });
  EXPECT_NE(launcher.find(strCat("this launcher cannot host the rendezvous store on any of ports ", port, "-",
                                 port + 1)),
            std::string::npos)
      << launcher;
}

// A launcher that hosts its job's store (srun's one task per node: node 0's) at a port taken by
// another job takes the next free one and claims it; the ranks, every one a client (rank 0
// too), find it there, as does one that looked before the launcher hosted it.
TEST(Store, ALaunchersJobStoreOnATakenPortIsFoundByItsClientRanks) {
  const int port = freePorts(4);
  ASSERT_GT(port, 0);
  const TakenPorts taken(port);
  StoreOptions e = searchingPorts(taken, "job-e");
  e.client_only = true;
  auto early = rankOneLooking(e);
  std::this_thread::sleep_for(300ms);  // rank 1 looks before the launcher hosts
  const auto hosted = hostJobStore(e);
  c10::intrusive_ptr<c10d::Store> ranks[2];
  ranks[0] = makeTcpStore(e);
  ranks[1] = early.get();
  const int at = hostedPort(*hosted);
  EXPECT_GE(at, port + 2);
  EXPECT_EQ(ownerAt(at), "job-e");
  ranks[1]->set("hello", std::vector<uint8_t>{7});
  EXPECT_EQ(ranks[0]->get("hello"), std::vector<uint8_t>{7});
  EXPECT_FALSE(taken.first->check({"hello"}));
}

}  // namespace
}  // namespace aiacc::comm
