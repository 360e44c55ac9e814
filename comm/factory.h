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
#include "aiacc/comm/options.h"
#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

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
