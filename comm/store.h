// Rendezvous: the key-value store ranks meet through, LibTorch's c10d TCPStore (hosted by rank
// 0, or by the process that launched the ranks) for processes, or one shared in-memory HashStore for ranks as threads
// in tests. All keys of a job are namespaced under a prefix, so several communicators can share one store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/key_log.h"
#include "aiacc/comm/options.h"
#include "aiacc/comm/timeout.h"

namespace aiacc::comm {

// Rank 0 hosts the server (unless client_only); everyone connects, then claims the store for
// o.job. A port already in use, or a store of another job, is a CommError saying so.
c10::intrusive_ptr<c10d::Store> makeTcpStore(const StoreOptions& o);
// `store` as makeTcpStore hands its own out: under o.prefix, each key written recorded in
// o.key_log when there is one. (connectProcessGroup with a store already made.)
c10::intrusive_ptr<c10d::Store> storeUnderPrefix(const StoreOptions& o, c10::intrusive_ptr<c10d::Store> store);

// For a launcher that starts the ranks: hosts the store's server at `port` (every interface; 0:
// a free port, hostedPort says which) in this process, for `world` ranks that connect with client_only. The rendezvous
// then outlives any one rank (rank 0's death no longer takes the store with it). A port in use is a CommError saying
// so. Keep the returned store alive for as long as the ranks run.
c10::intrusive_ptr<c10d::Store> hostStore(int port, int world, std::chrono::milliseconds timeout);

// hostStore for a job whose port came from a launcher's job id (o.port, o.port_tries, o.world,
// o.timeout, o.job): the server at the first of the ports it can bind, claimed for o.job at once,
// so that the ranks, client_only with the same port_tries, find it and pass over another job's.
// hostedPort says which port. A CommError when none is free.
c10::intrusive_ptr<c10d::Store> hostJobStore(const StoreOptions& o);

// The port a store from hostStore or hostJobStore listens on: with port 0 there, the free one the system chose.
int hostedPort(const c10d::Store& store);

// LibTorch 1.13's store server reads each request with blocking reads on its one thread: a client
// that sent part of a request and fell silent (its node's link went down between two of its
// writes, or anything wrote stray bytes to the port) held every other client's request, the whole
// job's rendezvous, for as long as its connection stayed open. Every server this module hosts
// bounds each such read: a client silent for `bound` in the middle of a request is disconnected,
// and the server goes on. That client's store has failed for good (c10d's clients do not
// reconnect): its process is lost to the job as if its node were, which after `bound` of silence
// in mid-request it most likely is: a live client writes a request's parts one right after
// another, and only one stopped (SIGSTOP, a debugger) for `bound` between two of them is dropped
// though alive. (A client between requests is not read, so it may be silent for ever. LibTorch 2's libuv server, the
// default since 2.4, reads without blocking; the bound changes nothing there.) hostStore and hostJobStore set
// kStalledRequestBound: 5 s without a byte is several TCP retransmissions lost in a row. Sends are
// not bounded: the server sends a reply once the whole request is in, to a client that waits for
// it. A CommError when this process has no server of `server`'s port listening.
constexpr std::chrono::milliseconds kStalledRequestBound{5000};
void boundStalledRequests(const c10d::Store& server, std::chrono::milliseconds bound);

// A TCP socket of this process whose local port is a given one: a server's listener, or a
// connection it accepted (the process's own clients have ephemeral local ports).
struct PortSocket {
  int fd = -1;
  bool listening = false;
  int peer_port = -1;  // the connection's peer's port (-1: a listener, or its peer unknown)
};
// This process's TCP sockets on local port `port`, from /proc/self/fd (none when it cannot be read).
// A descriptor is as it was when scanned: one closed and reused since is another socket.
std::vector<PortSocket> socketsOnPort(int port);

// The claim itself, on an unprefixed store (makeTcpStore calls it; tests call it directly).
void claimForJob(c10d::Store& store, const std::string& job, const std::string& where);

// An in-memory store for ranks as threads of one process.
c10::intrusive_ptr<c10d::Store> makeHashStore();

// Waits for every rank's "<what>/<rank>" key, polling with one check() of all of them (one
// request per poll, whatever the world size), turning a timeout into a CommError that names what
// was awaited and which ranks have not published their key. The pause between polls starts at
// 1 ms and doubles up to waitForRanksLongestPause(world): the store serves every waiting rank
// one request per pause, so the longest pause grows with the world (world / 10 ms, from 20 ms
// to 200 ms: about 10,000 requests a second at most from 2,000 ranks up, 50 per rank below).
void waitForRanks(c10d::Store& store, const std::string& what, int world, std::chrono::milliseconds timeout);
std::chrono::milliseconds waitForRanksLongestPause(int world);

}  // namespace aiacc::comm
