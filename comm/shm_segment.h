// The shared-memory segment each rank of a host maps per channel (comm/shm_transport.h): its
// header, which holds the rank's barrier word and its liveness, and the process-shared futex and
// /proc calls the channels wait and judge their peers with. Private to the library.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace aiacc::comm {
// In a named namespace, not an anonymous one: ShmTransport::Channel (of an exported class) uses it.
namespace shm_segment {

constexpr size_t kHeader = 128;  // two cache lines: the barrier and the rank's liveness

// What a rank's channel says of itself to its peers.
enum State : uint32_t { kOpen = 0, kAborted = 1, kClosed = 2 };

// seq: the last barrier this rank reached. word: its low 32 bits, the futex others sleep on.
// waiters: how many threads (of any rank) sleep or are about to sleep on word; the publisher
// makes the wake-up system call only when there is one. state: kAborted once abort() was
// called, kClosed once its worker ran its last operation (the transport is going). beat: bumped
// by the rank's heartbeat thread. life: a process-shared robust mutex the channel's worker thread
// holds for as long as it runs; the kernel releases it, marked "owner died", the moment that
// thread's process dies (in any PID namespace), so a peer's try-lock that succeeds means the rank
// is gone. pid and start: the process's id and start time (/proc/self/stat's 22nd field; 0:
// unknown), so that a peer in the same PID namespace can tell a stopped process from a slow one.
// mapped: how many peers have mapped this segment; the one that completes the count unlinks its
// name.
struct Header {
  std::atomic<uint64_t> seq;
  std::atomic<uint32_t> word;
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> beat;
  pthread_mutex_t life;
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> start;
  std::atomic<uint32_t> mapped;
};
static_assert(sizeof(Header) <= kHeader);
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex words are 32 bits");

// Process-shared futexes (no FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED segment that
// every rank of the node maps. futexWait returns when woken, after timeout_ns, or at once when
// *word != expected.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, long timeout_ns);
void futexWakeAll(std::atomic<uint32_t>* word);

// Process `pid`'s state letter and start time from /proc/PID/stat; false when unreadable.
bool procStat(pid_t pid, char* state, uint64_t* start);

}  // namespace shm_segment
}  // namespace aiacc::comm
