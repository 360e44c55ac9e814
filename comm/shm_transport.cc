#include "aiacc/comm/shm_transport.h"

#include <fcntl.h>
#include <pthread.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <string>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "aiacc/comm/channel_worker.h"
#include "aiacc/comm/reduce_ops.h"
#include "aiacc/comm/shm_segment.h"
#include "aiacc/comm/store.h"

namespace aiacc::comm {
using namespace shm_segment;

namespace {

std::string sanitize(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

}  // namespace

// One channel: this rank's segment and every peer's, mapped; a worker thread running the
// operations in submission order.
class ShmTransport::Channel {
 public:
  Channel(c10d::Store& store, const ShmOptions& o, const std::string& job, int index)
      : rank_(o.rank), world_(o.world), chunk_(static_cast<size_t>(o.chunk_bytes)), timeout_(o.timeout),
        heartbeat_timeout_(o.heartbeat_timeout), timeline_(o.timeline), row_(1 + o.row_base + index) {
    if (timeline_) timeline_->nameRow(row_, o.row_label + " " + std::to_string(index));
    size_ = kHeader + 2 * chunk_;
    area_ = chunk_ / static_cast<size_t>(world_) / 64 * 64;
    AIACC_CHECK(area_ >= 64, "shm chunk too small for ", world_, " ranks");
    auto name = [&](int r) { return strCat("/aiacc-", job, "-", sanitize(o.name), "-c", index, "-r", r); };
    const std::string mine = name(rank_);
    const int fd = ::shm_open(mine.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
      throw CommError(strCat("shm: cannot create ", mine, ": ", std::strerror(errno),
                             " (turn shared memory off to use Gloo over loopback)"),
                      CommError::Remedy::kSharedMemory);
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size_));
    if (rc != 0) {
      ::close(fd);
      ::shm_unlink(mine.c_str());
      throw CommError(strCat("shm: cannot reserve ", size_ >> 20, " MiB in /dev/shm: ", std::strerror(rc),
                             " (enlarge /dev/shm, or turn shared memory off to use Gloo over loopback)"),
                      CommError::Remedy::kSharedMemory);
    }
    base_.assign(static_cast<size_t>(world_), nullptr);
    try {
      connect(store, o, fd, mine, index, name);
    } catch (...) {  // a failed start (a peer missing, a mapping refused) leaves nothing behind
      ::shm_unlink(mine.c_str());
      if (worker_) worker_->shutdown();  // releases the liveness lock, in this rank's segment
      for (char* b : base_) {
        if (b) ::munmap(b, size_);
      }
      throw;
    }
  }

  // Maps this rank's segment (fd, named `mine`) and, once every rank created its own, every
  // peer's; starts the worker, which takes the liveness lock; unlinks `mine` once every rank
  // mapped it and holds its lock.
  template <typename NameFn>
  void connect(c10d::Store& store, const ShmOptions& o, int fd, const std::string& mine, int index, NameFn name) {
    base_[static_cast<size_t>(rank_)] = map(fd, mine);
    Header* h = new (header(rank_)) Header{};  // value-initialized: seq, word, waiters, state, beat, mapped 0
    char own_state = 0;
    uint64_t own_start = 0;
    if (procStat(::getpid(), &own_state, &own_start)) {
      h->pid.store(static_cast<int32_t>(::getpid()));
      h->start.store(own_start);
    }
    pthread_mutexattr_t attr;
    ::pthread_mutexattr_init(&attr);
    ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    const int rc = ::pthread_mutex_init(&h->life, &attr);
    ::pthread_mutexattr_destroy(&attr);
    if (rc != 0) AIACC_THROW(CommError, "shm: cannot make the liveness lock: ", std::strerror(rc));
    auto locked = std::make_shared<std::promise<void>>();
    ThreadHooks hooks;
    hooks.on_start = [h, locked] {
      ::pthread_mutex_lock(&h->life);
      locked->set_value();
    };
    hooks.on_exit = [h] {  // after the last queued operation: this rank leaves in order
      uint32_t open = kOpen;
      h->state.compare_exchange_strong(open, kClosed, std::memory_order_acq_rel);
      ::pthread_mutex_unlock(&h->life);
    };
    worker_ = std::make_unique<ChannelWorker>(timeline_, row_, std::move(hooks));
    locked->get_future().wait();  // peers may test the lock from now on
    const std::string key = strCat(o.name, "/shm/c", index);
    store.set(strCat(key, "/created/", rank_), std::vector<uint8_t>{1});
    waitForRanks(store, key + "/created", world_, timeout_);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      const std::string theirs = name(q);
      const int qfd = ::shm_open(theirs.c_str(), O_RDWR, 0600);
      if (qfd < 0)
        AIACC_THROW(CommError, "shm: cannot open rank ", q, "'s segment ", theirs, ": ", std::strerror(errno));
      base_[static_cast<size_t>(q)] = map(qfd, theirs);
      // The last peer to map q's segment unlinks its name, before it says it mapped: whoever dies
      // after the set-up (its owner among them, killed before it would see every "mapped" below)
      // leaves nothing in /dev/shm.
      if (header(q)->mapped.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(world_ - 1)) {
        ::shm_unlink(theirs.c_str());
      }
    }
    store.set(strCat(key, "/mapped/", rank_), std::vector<uint8_t>{1});
    waitForRanks(store, key + "/mapped", world_, timeout_);
    ::shm_unlink(mine.c_str());  // world 1 (no peer unlinks it); else gone already (ENOENT)
  }

  ~Channel() {
    if (worker_) worker_->shutdown();  // before the mappings go; marks this rank closed
    for (char* b : base_) {
      if (b) ::munmap(b, size_);
    }
  }

  ChannelStats stats() const { return worker_->stats(); }

  // Queued and later operations fail at once; one in flight leaves its barrier within one
  // sleep (20 ms), and so do the peers waiting for this rank there (they read kAborted).
  void abort(const std::string& why) {
    worker_->abort(why);
    aborted_.store(true, std::memory_order_release);
    header(rank_)->state.store(kAborted, std::memory_order_release);
  }

  void beat() { header(rank_)->beat.fetch_add(1, std::memory_order_relaxed); }

  std::shared_ptr<Work> submit(const char* what, size_t bytes, std::function<void()> fn) {
    return worker_->submit(what, bytes, std::move(fn));
  }

  // ---- Collectives (run on the worker thread) -------------------------------------------------

  // Shards are the whole buffer's (shardOf(n, P, r)), moved in rounds: a slot is split into P
  // areas, and in round k area q of every rank's slot holds piece k of shard q.
  void allreduce(at::Tensor t, ReduceFn fn, bool gather) {
    const int64_t es = static_cast<int64_t>(t.element_size()), n = t.numel();
    const int64_t piece = static_cast<int64_t>(area_) / es;
    char* data = static_cast<char*>(t.data_ptr());
    const int64_t rounds = (shardOf(n, world_, 0).count + piece - 1) / piece;  // shard 0 is the largest
    for (int64_t k = 0; k < rounds; ++k) {
      const int s = nextSlot();
      for (int q = 0; q < world_; ++q) {
        const auto [a, len] = pieceOf(n, q, k, piece);
        if (len > 0) std::memcpy(area(rank_, s, q), data + a * es, len * es);
      }
      barrier();
      // Piece k of this rank's shard, summed over ranks in rank order: computed once, by its
      // owner, so every rank ends with the same bits.
      const auto [a, len] = pieceOf(n, rank_, k, piece);
      char* dst = data + a * es;
      if (len > 0) {
        std::memcpy(dst, area(0, s, rank_), len * es);
        for (int q = 1; q < world_; ++q) fn(dst, dst, area(q, s, rank_), static_cast<size_t>(len));
      }
      if (!gather) continue;  // reduce-scatter: this rank's shard is done
      if (len > 0) std::memcpy(area(rank_, s, rank_), dst, len * es);
      barrier();
      copyOthers(data, n, es, s, k, piece);
    }
  }

  void allgatherShards(at::Tensor t) {
    const int64_t es = static_cast<int64_t>(t.element_size()), n = t.numel();
    const int64_t piece = static_cast<int64_t>(area_) / es;
    char* data = static_cast<char*>(t.data_ptr());
    const int64_t rounds = (shardOf(n, world_, 0).count + piece - 1) / piece;
    for (int64_t k = 0; k < rounds; ++k) {
      const int s = nextSlot();
      const auto [a, len] = pieceOf(n, rank_, k, piece);
      if (len > 0) std::memcpy(area(rank_, s, rank_), data + a * es, len * es);
      barrier();
      copyOthers(data, n, es, s, k, piece);
    }
  }

  void broadcast(at::Tensor t, int root) {
    const size_t n = t.nbytes();
    char* data = static_cast<char*>(t.data_ptr());
    for (size_t off = 0; off < n; off += chunk_) {
      const size_t len = std::min(chunk_, n - off);
      const int s = nextSlot();
      if (rank_ == root) std::memcpy(slot(root, s), data + off, len);
      barrier();
      if (rank_ != root) std::memcpy(data + off, slot(root, s), len);
    }
  }

  void allgather(at::Tensor in, at::Tensor out) {
    const size_t n = in.nbytes();
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    for (size_t off = 0; off < n; off += chunk_) {
      const size_t len = std::min(chunk_, n - off);
      const int s = nextSlot();
      std::memcpy(slot(rank_, s), src + off, len);
      barrier();
      for (int q = 0; q < world_; ++q) std::memcpy(dst + q * n + off, slot(q, s), len);
    }
  }

 private:
  char* map(int fd, const std::string& name) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) AIACC_THROW(CommError, "shm: cannot map ", name, ": ", std::strerror(errno));
    return static_cast<char*>(p);
  }
  Header* header(int q) const { return reinterpret_cast<Header*>(base_[static_cast<size_t>(q)]); }
  char* slot(int q, int s) const { return base_[static_cast<size_t>(q)] + kHeader + static_cast<size_t>(s) * chunk_; }
  // Area q of rank r's slot s: where piece k of shard q travels.
  char* area(int r, int s, int q) const { return slot(r, s) + static_cast<size_t>(q) * area_; }
  // Piece k of shard q: (first element, element count), count 0 past the shard's end.
  std::pair<int64_t, int64_t> pieceOf(int64_t n, int q, int64_t k, int64_t piece) const {
    const Shard sh = shardOf(n, world_, q);
    const int64_t a = sh.offset + k * piece;
    return {a, std::max<int64_t>(0, std::min(piece, sh.offset + sh.count - a))};
  }
  void copyOthers(char* data, int64_t n, int64_t es, int s, int64_t k, int64_t piece) {
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      const auto [a, len] = pieceOf(n, q, k, piece);
      if (len > 0) std::memcpy(data + a * es, area(q, s, q), len * es);
    }
  }
  int nextSlot() {
    slot_ ^= 1;
    return slot_;
  }

  // Everyone publishes the next sequence number and waits for everyone else's: a short spin (a
  // peer that is a few microseconds behind), then sleep on the peer's futex word. Sleeping, not
  // spinning or yielding, is what keeps a waiting channel thread off the cores: on a host with
  // fewer cores than busy threads, a spinning waiter takes CPU time from the very computation
  // it waits for.
  //
  // Between sleeps a waiter checks, in this order: its own abort(); the peer's: aborted, closed,
  // gone (its liveness lock free: the process died), silent (no heartbeat for
  // heartbeat_timeout: stopped or hung); then the timeout. Each is a CommError naming the rank,
  // raised only if the peer has still not reached the barrier after it was seen (a peer that
  // arrived and then left is no failure of this barrier).
  void barrier() {
    ++seq_;
    Header* mine = header(rank_);
    mine->seq.store(seq_, std::memory_order_seq_cst);
    mine->word.store(static_cast<uint32_t>(seq_), std::memory_order_seq_cst);
    // seq_cst on both sides (Dekker): a waiter that registered before this load is woken; one
    // that registers after it sees the new word and does not sleep.
    if (mine->waiters.load(std::memory_order_seq_cst) > 0) futexWakeAll(&mine->word);
    const auto start = std::chrono::steady_clock::now();
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      Header* h = header(q);
      const auto arrived = [&] { return h->seq.load(std::memory_order_acquire) >= seq_; };
      Silence silence{h->beat.load(std::memory_order_relaxed), start};
      int spins = 0;
      while (!arrived()) {
        if (++spins < 256) {
          _mm_pause();
          continue;
        }
        h->waiters.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t seen = h->word.load(std::memory_order_seq_cst);
        if (h->seq.load(std::memory_order_seq_cst) < seq_) {
          futexWait(&h->word, seen, 20 * 1000 * 1000);  // 20 ms: the checks below run
        }
        h->waiters.fetch_sub(1, std::memory_order_seq_cst);
        const std::string lost = peerLost(q, silence);
        if (!lost.empty() && !arrived()) throw CommError(lost);
        if (std::chrono::steady_clock::now() - start > timeout_) {
          AIACC_THROW(CommError, "shm: rank ", q, " did not reach the barrier within ", timeout_.count() / 1000.0,
                      " s (it is alive and sends heartbeats, but stalled: a different sequence of operations?)");
        }
      }
    }
  }

  // The last heartbeat seen from a peer, and when it changed.
  struct Silence {
    uint32_t beat;
    std::chrono::steady_clock::time_point since;
  };

  // Why a barrier can no longer complete because of rank q (or this rank's own abort), or "".
  std::string peerLost(int q, Silence& silence) {
    if (aborted_.load(std::memory_order_acquire)) {
      return strCat("shm: aborted while waiting for rank ", q, ": ", worker_->firstError().what());
    }
    Header* h = header(q);
    const uint32_t state = h->state.load(std::memory_order_acquire);
    if (state == kAborted) return strCat("shm: rank ", q, " aborted its collectives (it met a failure first)");
    if (state == kClosed) return strCat("shm: rank ", q, " closed its transport (it left the job)");
    if (ownerGone(h)) return strCat("shm: rank ", q, " died (its process is gone)");
    const auto now = std::chrono::steady_clock::now();
    const uint32_t beat = h->beat.load(std::memory_order_relaxed);
    if (beat != silence.beat) {
      silence = {beat, now};
    } else if (heartbeat_timeout_.count() > 0 && now - silence.since > heartbeat_timeout_ && !merelySlow(h)) {
      return strCat("shm: rank ", q, " stopped responding: no heartbeat for ",
                    std::chrono::duration<double>(now - silence.since).count(),
                    " s (its process is stopped, e.g. by SIGSTOP or a debugger, or cannot be seen in /proc)");
    }
    return "";
  }

  // A silent peer's process, seen in /proc (same PID namespace: the pid and start time match), is
  // not stopped: it is slow (its heartbeat thread waited for a core, or this rank itself was not
  // running), not hung: running, sleeping or in the kernel (R, S, D). False otherwise (stopped: T,
  // t) or when it cannot be seen. (A process frozen by a cgroup freezer shows S or D: waited for.)
  static bool merelySlow(Header* h) {
    const int32_t pid = h->pid.load(std::memory_order_relaxed);
    const uint64_t start = h->start.load(std::memory_order_relaxed);
    char state = 0;
    uint64_t now_start = 0;
    if (pid <= 0 || !procStat(pid, &state, &now_start) || now_start != start) return false;
    return state == 'R' || state == 'S' || state == 'D';  // (not T or t: stopped; nor Z, X: gone)
  }

  // Whether the thread holding h's liveness lock is gone. A try-lock that fails with EBUSY: it
  // runs. EOWNERDEAD: its process died (the lock is made consistent and released, so that every
  // other peer sees it free too). 0: released, by a worker that exited.
  static bool ownerGone(Header* h) {
    const int rc = ::pthread_mutex_trylock(&h->life);
    if (rc == EBUSY) return false;
    if (rc == EOWNERDEAD) ::pthread_mutex_consistent(&h->life);
    if (rc == 0 || rc == EOWNERDEAD) ::pthread_mutex_unlock(&h->life);
    return true;  // also ENOTRECOVERABLE: nobody can hold it any more
  }

  int rank_, world_;
  size_t chunk_, size_ = 0, area_ = 0;  // area_: a slot's share per rank, 64-byte aligned
  std::chrono::milliseconds timeout_, heartbeat_timeout_;
  std::atomic<bool> aborted_{false};
  std::shared_ptr<Timeline> timeline_;
  int row_;
  std::vector<char*> base_;
  uint64_t seq_ = 0;
  int slot_ = 1;
  std::unique_ptr<ChannelWorker> worker_;
};

// The rank's heartbeat: a thread that bumps every channel's beat until the transport goes.
class ShmTransport::Heart {
 public:
  Heart(std::vector<Channel*> channels, std::chrono::milliseconds period)
      : channels_(std::move(channels)), period_(period), thread_([this] { loop(); }) {}
  ~Heart() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      for (Channel* ch : channels_) ch->beat();
      cv_.wait_for(lock, period_, [&] { return stop_; });
    }
  }
  std::vector<Channel*> channels_;
  std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

ShmTransport::ShmTransport(c10::intrusive_ptr<c10d::Store> store, const ShmOptions& options) : opt_(options) {
  AIACC_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "rank ", opt_.rank, " of ", opt_.world);
  AIACC_CHECK_INPUT(opt_.channels >= 1 && opt_.channels <= 16, "channels must be 1..16");
  AIACC_CHECK_INPUT(opt_.heartbeat_timeout.count() >= 0, "heartbeat_timeout must be >= 0");
  AIACC_CHECK(opt_.chunk_bytes >= 4096 && opt_.chunk_bytes % 64 == 0, "shm chunk must be >= 4 KiB, a multiple of 64");
  // A job id from rank 0, so concurrent jobs on one host never share segment names.
  const std::string id_key = opt_.name + "/shm/id";
  if (opt_.rank == 0) {
    std::random_device rd;
    const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
    const std::string hex = strCat(std::hex, id);
    store->set(id_key, std::vector<uint8_t>(hex.begin(), hex.end()));
  }
  store->wait({id_key}, opt_.timeout);
  const auto id = store->get(id_key);
  const std::string job(id.begin(), id.end());
  for (int c = 0; c < opt_.channels; ++c) channels_.push_back(std::make_unique<Channel>(*store, opt_, job, c));
  if (opt_.heartbeat_timeout.count() > 0) {
    std::vector<Channel*> all;
    for (auto& ch : channels_) all.push_back(ch.get());
    heart_ = std::make_unique<Heart>(std::move(all),
                                     std::max(std::chrono::milliseconds(50), opt_.heartbeat_timeout / 6));
  }
}

ShmTransport::~ShmTransport() = default;

std::string ShmTransport::describe() const {
  return strCat("shm, ", opt_.world, " ranks, ", channels(), channels() == 1 ? " channel" : " channels");
}

void ShmTransport::abort(const std::string& why) {
  for (auto& ch : channels_) ch->abort(why);
}

ChannelStats ShmTransport::channelStats(int c) const {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return channels_[static_cast<size_t>(c)]->stats();
}

ShmTransport::Channel& ShmTransport::channel(int c) {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return *channels_[static_cast<size_t>(c)];
}

std::shared_ptr<Work> ShmTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  checkContiguousCpu(t, "allreduce");
  const ReduceFn fn = reduceFunction(t.scalar_type(), op);
  Channel& ch = channel(c);
  return ch.submit("allreduce", t.nbytes(), [&ch, t, fn] { ch.allreduce(t, fn, /*gather=*/true); });
}

std::shared_ptr<Work> ShmTransport::reduceScatter(at::Tensor t, int c) {
  checkContiguousCpu(t, "reduceScatter");
  const ReduceFn fn = reduceFunction(t.scalar_type(), ReduceOp::kSum);
  Channel& ch = channel(c);
  return ch.submit("reduce-scatter", t.nbytes(), [&ch, t, fn] { ch.allreduce(t, fn, /*gather=*/false); });
}

std::shared_ptr<Work> ShmTransport::allgatherShards(at::Tensor t, int c) {
  checkContiguousCpu(t, "allgatherShards");
  Channel& ch = channel(c);
  return ch.submit("allgather", t.nbytes(), [&ch, t] { ch.allgatherShards(t); });
}

std::shared_ptr<Work> ShmTransport::broadcast(at::Tensor t, int root, int c) {
  checkContiguousCpu(t, "broadcast");
  AIACC_CHECK(root >= 0 && root < size(), "broadcast root ", root);
  Channel& ch = channel(c);
  return ch.submit("broadcast", t.nbytes(), [&ch, t, root] { ch.broadcast(t, root); });
}

std::shared_ptr<Work> ShmTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  checkContiguousCpu(in, "allgather");
  checkContiguousCpu(out, "allgather");
  AIACC_CHECK(out.nbytes() == in.nbytes() * static_cast<size_t>(size()), "allgather: out must hold ", size(), " x in");
  Channel& ch = channel(c);
  return ch.submit("allgather", out.nbytes(), [&ch, in, out] { ch.allgather(in, out); });
}

}  // namespace aiacc::comm
