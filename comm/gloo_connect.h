// Internal to GlooTransport (not installed): one Gloo context connected in a full mesh through a
// c10d store, under a key prefix of its own, and the interrupt that ends every operation pending
// on a context.
#pragma once

#include <gloo/rendezvous/context.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace aiacc::comm {

// Connects rank `rank` of `world` to every peer, listening on bind_host, meeting under `prefix`
// in the store. A rank that does not come within `timeout`, or a failed connection, is a
// CommError starting with `label` (e.g. "channel 1").
std::shared_ptr<gloo::rendezvous::Context> connectGloo(c10::intrusive_ptr<c10d::Store> store, const std::string& prefix,
                                                       int rank, int world, const std::string& bind_host,
                                                       std::chrono::milliseconds timeout, const std::string& label);

// Ends every operation pending on `context`, on any thread, at once, and closes its sockets (so
// the peers' operations with this rank fail at once too); the context is unusable afterwards.
// Gloo has no call for it, but an application timeout does exactly this: a receive on a slot
// nobody sends to, awaited for 1 ms, makes Gloo signal the timeout to every pair. Safe to call
// from any thread, and again (a later call finds the pairs closed and does nothing).
void interruptGloo(gloo::Context& context);

}  // namespace aiacc::comm
