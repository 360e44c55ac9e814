// The one place a transport is picked: NCCL for GPU ranks (when built with it), shared memory
// between ranks of one host, Gloo over TCP between hosts, and two-level reduction composed of
// an intra-node and an inter-node transport.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "aiacc/comm/gradient_sync.h"
#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

// Two-level reduction (intra-node reduce-scatter, inter-node allreduce, intra-node allgather).
enum class TwoLevelMode {
  kOff,
  kOn,
  kAuto,  // on between nodes with several ranks each
};

struct TransportSpec {
  WorldInfo world;
  int channels = 1;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string bind_host = "127.0.0.1";  // where Gloo listens
  bool gpu = false;                     // tensors live on CUDA device `device`: NCCL
  int device = -1;                      // this rank's CUDA device; -1: world.local_rank
  bool shm = true;                      // shared memory between ranks of one host
  // Two-level reduction; where it applies (kOn, or kAuto between nodes) and tune_two_level is
  // set, the flat transport is primary and the two-level one the tuner's alternative.
  TwoLevelMode hierarchical = TwoLevelMode::kAuto;
  int ranks_per_node = 0;  // 0: world.local_size (consecutive ranks form a node)
  bool tune_two_level = false;
  std::shared_ptr<Timeline> timeline;
  // Notices from the transports, one line each (NCCL: its environment); default: none.
  std::function<void(const std::string&)> log;
};

struct Transports {
  std::shared_ptr<Transport> primary;
  std::shared_ptr<Transport> alternative;  // two-level, for the tuner; null when not tuned
  std::string why;                         // one line: what was picked and why
};

// Whether two-level reduction applies to this job (and how many ranks form a node).
int ranksPerNode(const TransportSpec& spec);
bool useTwoLevel(const TransportSpec& spec);

// Throws InputError when this build has no transport for the layout (CPU ranks across hosts, or
// with shared memory off, in a build without GlooTransport). Needs no store: call it before the
// rendezvous, so that every rank refuses at once instead of waiting for a peer that refused.
void checkLayoutSupported(const TransportSpec& spec);

// Calls checkLayoutSupported first.
Transports makeTransports(c10::intrusive_ptr<c10d::Store> store, const TransportSpec& spec);

}  // namespace aiacc::comm
