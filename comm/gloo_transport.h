// GlooTransport: CPU collectives over TCP with Gloo, one Gloo context and one worker thread per
// channel. Contexts meet through a c10d store (rendezvous), each under its own key prefix.
// A peer that dies closes its sockets, and writing to one raises SIGPIPE, whose default action
// ends the process before Gloo can report the error: a program using GlooTransport ignores
// SIGPIPE (signal(SIGPIPE, SIG_IGN), as Python does) before it starts threads, so that a dead
// peer becomes a CommError naming the collective. aiacc_train does at start-up; the transport
// leaves the process's signal dispositions alone.
// abort() ends the collective in flight at once as well as the queued ones, and closes the
// channel's sockets, so the peers' operations with this rank fail at once too. A peer that dies
// is named at once (its sockets close); one that stops responding (SIGSTOP, a hang, a silent
// network) within heartbeat_timeout, through heartbeats on a context of their own (gloo_pulse.h).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

class GlooPulse;  // internal: the heartbeats

struct GlooOptions {
  int rank = 0;
  int world = 1;
  int channels = 1;
  std::string bind_host = "127.0.0.1";                  // address this rank listens on (reachable by peers)
  std::chrono::milliseconds timeout = kDefaultTimeout;  // every collective and the connection phase
  // A peer whose heartbeats stop for this long (stopped, hung, its network silent: alive to TCP)
  // is lost: every operation fails at once naming it. 0: only the timeout ends a wait for it.
  std::chrono::milliseconds heartbeat_timeout{3000};
  std::string name = "gloo";           // key prefix in the store: distinct communicators, distinct names
  std::shared_ptr<Timeline> timeline;  // when set: every operation as a span on row 1 + row_base + channel
  int row_base = 0;                    // timeline rows of this transport's channels start here
  std::string row_label = "channel";   // timeline row names: "<row_label> <channel>"
};

class GlooTransport : public Transport {
 public:
  // Connects every channel (full mesh). Blocks until all ranks joined or the timeout expired.
  GlooTransport(c10::intrusive_ptr<c10d::Store> store, const GlooOptions& options);
  ~GlooTransport() override;

  int rank() const override { return opt_.rank; }
  int size() const override { return opt_.world; }
  int channels() const override { return static_cast<int>(channels_.size()); }
  ChannelStats channelStats(int channel) const override;
  std::string describe() const override;

  std::shared_ptr<Work> allreduce(at::Tensor t, ReduceOp op, int channel) override;
  std::shared_ptr<Work> broadcast(at::Tensor t, int root, int channel) override;
  std::shared_ptr<Work> allgather(at::Tensor in, at::Tensor out, int channel) override;
  std::shared_ptr<Work> reduceScatter(at::Tensor t, int channel) override;
  std::shared_ptr<Work> allgatherShards(at::Tensor t, int channel) override;
  void abort(const std::string& why) override;

 private:
  class Channel;
  Channel& channel(int c);
  GlooOptions opt_;
  c10::intrusive_ptr<c10d::Store> store_;  // kept: rank 0 hosts it for the others
  std::vector<std::unique_ptr<Channel>> channels_;
  std::unique_ptr<GlooPulse> pulse_;  // after channels_: stops before they go (it aborts them)
};

}  // namespace aiacc::comm
