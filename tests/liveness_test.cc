// Liveness of the CPU transports: a waiter does not wait out the timeout for a peer that can never
// come. abort() ends the operation in flight on its own rank and on the peers waiting for it
// (shared memory and Gloo); over shared memory (comm/shm_transport.h), a peer that closed its
// transport, a peer process that died (SIGKILL) and one that is stopped (SIGSTOP) are each named
// by their cause, with a timeout of ten minutes that none of them may reach; over Gloo, a peer
// process that died or stopped. The peer processes are tests/peer_rank.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/store.h"
#include "tests/build_paths.h"  // AIACC_PEER_RANK_BIN
#include "tests/comm_test_util.h"

extern char** environ;

namespace aiacc::comm {
namespace {

using test::expectNoErrors;
using test::runThreads;

constexpr std::chrono::minutes kNeverReached{10};

ShmOptions shmOptions(int rank, int world) {
  ShmOptions o;
  o.rank = rank;
  o.world = world;
  o.chunk_bytes = 4096;
  o.timeout = kNeverReached;
  return o;
}

// The message of the error `work` ends with ("" if none).
std::string errorOf(const std::shared_ptr<Work>& work) {
  try {
    work->wait();
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

// Rank 0's allgather of two rounds is in flight for certain once rank 1's allgather of one round
// returned (its one barrier needed rank 0 there). abort() on rank 0 ends it, and rank 1's next
// operation ends too: it reads that rank 0 aborted.
TEST(Liveness, AbortEndsTheOperationInFlightHereAndOnThePeers) {
  auto store = makeHashStore();
  std::promise<void> rank1_round_done, rank0_aborted;
  std::string error0, error1;
  expectNoErrors(runThreads(2, [&](int r) {
    ShmTransport shm(store, shmOptions(r, 2));
    if (r == 0) {
      at::Tensor in = at::ones({2048}), out = at::empty({4096});  // 8 KiB: two 4 KiB rounds
      auto work = shm.allgather(in, out, 0);
      rank1_round_done.get_future().wait();
      shm.abort("the test aborts rank 0");
      error0 = errorOf(work);
      rank0_aborted.set_value();
    } else {
      at::Tensor in = at::ones({1024}), out = at::empty({2048});  // 4 KiB: one round
      shm.allgather(in, out, 0)->wait();
      rank1_round_done.set_value();
      rank0_aborted.get_future().wait();
      at::Tensor t = at::ones({16});
      error1 = errorOf(shm.allreduce(t, ReduceOp::kSum, 0));
    }
  }));
  EXPECT_EQ(error0, "shm: aborted while waiting for rank 1: the test aborts rank 0");
  EXPECT_EQ(error1, "shm: rank 0 aborted its collectives (it met a failure first)");
}

// Gloo, with a timeout of ten minutes: rank 0's allreduce waits for rank 1, which is busy
// elsewhere; abort() ends it at once with its reason (the test would otherwise wait the ten
// minutes), and rank 1's next operation fails at once: rank 0 closed its sockets.
TEST(Liveness, GlooAbortEndsTheOperationInFlightHereAndOnThePeers) {
  AIACC_SKIP_WITHOUT_GLOO();
#if AIACC_WITH_GLOO
  auto store = makeHashStore();
  std::promise<void> rank0_aborted;
  std::string error0, error1;
  expectNoErrors(runThreads(2, [&](int r) {
    GlooTransport gloo(store, test::glooOptions(r, 2, 1, kNeverReached));
    if (r == 0) {
      at::Tensor t = at::ones({1000});
      auto work = gloo.allreduce(t, ReduceOp::kSum, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // in flight (queued fails alike)
      gloo.abort("the test aborts rank 0");
      error0 = errorOf(work);
      rank0_aborted.set_value();
    } else {
      rank0_aborted.get_future().wait();
      at::Tensor t = at::ones({1000});
      error1 = errorOf(gloo.allreduce(t, ReduceOp::kSum, 0));
    }
  }));
  EXPECT_EQ(error0, "the test aborts rank 0");
  EXPECT_NE(error1.find("collective failed on rank 1: "), std::string::npos) << error1;
#endif
}

// A peer that destroyed its transport is named at once; one that is alive and merely never
// arrives is still waited for until the timeout.
TEST(Liveness, APeerThatLeftIsNamedAtOnceAndALiveOneAtTheTimeout) {
  auto store = makeHashStore();
  std::string left;
  expectNoErrors(runThreads(2, [&](int r) {
    ShmTransport shm(store, shmOptions(r, 2));
    if (r == 1) return;  // leaves without taking part
    at::Tensor t = at::ones({100});
    left = errorOf(shm.allreduce(t, ReduceOp::kSum, 0));
  }));
  EXPECT_EQ(left, "shm: rank 1 closed its transport (it left the job)");

  auto store2 = makeHashStore();
  std::promise<void> done;
  std::string stalled;
  expectNoErrors(runThreads(2, [&](int r) {
    ShmOptions o = shmOptions(r, 2);
    o.timeout = std::chrono::seconds(1);  // set-up too: both threads start at once
    ShmTransport shm(store2, o);
    if (r == 1) return done.get_future().wait();  // alive, heartbeats on, never arrives
    at::Tensor t = at::ones({100});
    stalled = errorOf(shm.allreduce(t, ReduceOp::kSum, 0));
    done.set_value();
  }));
  EXPECT_NE(stalled.find("shm: rank 1 did not reach the barrier within 1 s (it is alive"), std::string::npos)
      << stalled;
}

// Rank 1 as a process of its own (aiacc_peer_rank) over `transport`, meeting at a real TCPStore
// on loopback.
class PeerProcess {
 public:
  // `options`: aiacc_peer_rank's after WORLD ("silent", "name=NAME").
  explicit PeerProcess(const std::string& transport, const std::vector<std::string>& options = {}) {
    c10d::TCPStoreOptions so;
    so.port = 0;  // the kernel picks a free one
    so.isServer = true;
    so.numWorkers = 2;
    so.waitWorkers = false;
    so.timeout = std::chrono::seconds(60);
    store_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    const std::string port = std::to_string(store_->getPort());
    std::vector<std::string> args = {AIACC_PEER_RANK_BIN, transport, "127.0.0.1", port, "1", "2"};
    args.insert(args.end(), options.begin(), options.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~PeerProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::kill(pid_, SIGCONT);
    ::waitpid(pid_, nullptr, 0);
  }
  bool started() const { return pid_ > 0; }
  c10::intrusive_ptr<c10d::Store> store() const { return store_; }
  void signal(int sig) const { ::kill(pid_, sig); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
  pid_t pid_ = -1;
};

// SIGKILL: the peer's liveness lock is released by the kernel; named within a sleep, with the
// heartbeat off (so the lock, not the heartbeat, tells).
TEST(Liveness, APeerProcessThatDiedIsNamedAtOnce) {
  PeerProcess peer("shm");
  ASSERT_TRUE(peer.started());
  ShmOptions o = shmOptions(0, 2);
  o.heartbeat_timeout = std::chrono::milliseconds(0);
  ShmTransport shm(peer.store(), o);  // returns once the peer mapped every segment and holds its lock
  at::Tensor t = at::ones({100});
  auto work = shm.allreduce(t, ReduceOp::kSum, 0);
  peer.signal(SIGKILL);
  EXPECT_EQ(errorOf(work), "shm: rank 1 died (its process is gone)");
}

// SIGSTOP: the process holds its lock but its heartbeat stops; named after heartbeat_timeout.
TEST(Liveness, AStoppedPeerProcessIsNamedAfterTheHeartbeatTimeout) {
  PeerProcess peer("shm");
  ASSERT_TRUE(peer.started());
  ShmOptions o = shmOptions(0, 2);
  o.heartbeat_timeout = std::chrono::milliseconds(1000);
  ShmTransport shm(peer.store(), o);
  peer.signal(SIGSTOP);
  at::Tensor t = at::ones({100});
  const std::string error = errorOf(shm.allreduce(t, ReduceOp::kSum, 0));
  EXPECT_NE(error.find("shm: rank 1 stopped responding: no heartbeat for "), std::string::npos) << error;
  EXPECT_NE(error.find(" s (its process is stopped, e.g. by SIGSTOP or a debugger, or cannot be seen in /proc)"),
            std::string::npos)
      << error;
}

// A peer process whose heartbeat stops but that is not stopped (here it sends none at all, as one
// whose heartbeat thread waits seconds for a core on a loaded host would) is slow, not hung: it
// is not named after heartbeat_timeout (it was, and a loaded CI box once had an elastic job's
// newcomer left out as "stopped responding" while it set up). Once SIGSTOPped it is.
TEST(Liveness, ASilentPeerThatIsNotStoppedIsWaitedForAndNamedOnceStopped) {
  PeerProcess peer("shm", {"silent"});
  ASSERT_TRUE(peer.started());
  ShmOptions o = shmOptions(0, 2);
  o.heartbeat_timeout = std::chrono::milliseconds(200);
  o.timeout = std::chrono::seconds(30);  // (bounds the wait below should the stop go unnamed)
  ShmTransport shm(peer.store(), o);
  at::Tensor t = at::ones({100});
  auto error = std::async(std::launch::async, [&] { return errorOf(shm.allreduce(t, ReduceOp::kSum, 0)); });
  // Seven heartbeat timeouts of silence: still waiting.
  EXPECT_EQ(error.wait_for(std::chrono::milliseconds(1400)), std::future_status::timeout);
  peer.signal(SIGSTOP);
  ASSERT_EQ(error.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_NE(error.get().find("shm: rank 1 stopped responding: no heartbeat for "), std::string::npos);
}

// The files in /dev/shm of a shared-memory transport named `name` (ShmOptions::name).
std::vector<std::string> segmentsNamed(const std::string& name) {
  std::vector<std::string> found;
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string file = f.path().filename().string();
    if (file.rfind("aiacc-", 0) == 0 && file.find("-" + name + "-c") != std::string::npos) found.push_back(file);
  }
  return found;
}

// Once the set-up has returned on any rank, no segment has a name left in /dev/shm (the last peer
// to map each one unlinks it): a rank killed right after leaves nothing behind. (Each rank used to
// unlink its own once it saw that every rank had mapped it, up to a poll of the store later; one
// killed in between left its 8 MiB segment in /dev/shm until the machine restarted: a run of the
// suite left one.)
TEST(Liveness, APeerKilledRightAfterTheSetUpLeavesNoSegmentBehind) {
  const std::string name = "unlinked" + std::to_string(::getpid());
  std::vector<std::string> after_set_up;
  {
    PeerProcess peer("shm", {"name=" + name});
    ASSERT_TRUE(peer.started());
    ShmOptions o = shmOptions(0, 2);
    o.name = name;
    ShmTransport shm(peer.store(), o);
    after_set_up = segmentsNamed(name);
    peer.signal(SIGKILL);
  }
  EXPECT_TRUE(after_set_up.empty()) << after_set_up.front();
  const std::vector<std::string> left = segmentsNamed(name);
  EXPECT_TRUE(left.empty()) << left.front();
}

// Gloo: a SIGKILLed peer's sockets close, a SIGSTOPped one's heartbeats stop (heartbeat_timeout
// 1 s); either ends the operation in flight, with a timeout of ten minutes it must not reach.
TEST(Liveness, GlooNamesAPeerProcessThatDiedOrStopped) {
  AIACC_SKIP_WITHOUT_GLOO();
#if AIACC_WITH_GLOO
  for (const int sig : {SIGKILL, SIGSTOP}) {
    PeerProcess peer("gloo");
    ASSERT_TRUE(peer.started());
    GlooOptions o = test::glooOptions(0, 2, 1, kNeverReached);
    o.heartbeat_timeout = std::chrono::milliseconds(1000);
    GlooTransport gloo(peer.store(), o);
    at::Tensor t = at::ones({1000});
    auto work = gloo.allreduce(t, ReduceOp::kSum, 0);
    peer.signal(sig);
    const std::string error = errorOf(work);
    if (sig == SIGKILL) {
      EXPECT_NE(error.find("collective failed on rank 0: "), std::string::npos) << error;
      EXPECT_EQ(error.find("Timed out"), std::string::npos) << error;
    } else {
      EXPECT_NE(error.find("gloo: rank 1 stopped responding: no heartbeat for "), std::string::npos) << error;
    }
  }
#endif
}

}  // namespace
}  // namespace aiacc::comm
