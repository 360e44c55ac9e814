// CommHook: a user's own gradient transform (compression, quantization, a different reduction), in
// the shape of PyTorch DDP's communication hooks (register_comm_hook(state, hook), where the hook
// takes a GradBucket and returns a future of the averaged bucket).
//
// DataParallel's Reducer hands each bucket to the hook twice:
//   1. launch(bucket, transport), on the autograd thread as soon as every gradient of the bucket
//      is ready, or inside finishBackward() for a bucket with a parameter that got no gradient
//      (buckets in plan order, the same sequence on every rank): bucket.buffer holds this rank's
//      gradients, flat, of the parameters' dtype and device (fp32 for the usual model; zeros for
//      parameters without one). Not called while sync is off (accumulation). The hook starts its
//      collectives on `transport` and returns the Work that is done when they all are: for several,
//      allOf(works, transport) (never just the last one: `transport` spreads small operations
//      over its channels, which finish in any order); the same collectives, in the same order, on
//      every rank. Whatever launch() throws aborts the transports (its peers then fail at once).
//   2. finish(bucket), on the training thread inside finishBackward(), after that Work is done:
//      the hook leaves in bucket.buffer the gradient every rank applies (normally the average over
//      ranks). Returns false to skip the step; the verdict must be the same on every rank, so
//      derive it from reduced values only.
// bucket.state survives from launch() to finish() of the same bucket and step: the hook's place for
// its wire tensor. DataParallel then writes bucket.buffer back into each parameter's .grad. State
// a hook keeps across steps (error feedback) is valid only while bucket.plan stays the same: the
// buckets are rebuilt after the first step, at each of the tuner's trials and on a restore.
// The hook runs under the Reducer's lock: it must not call back into DataParallel.
//
// A hook decides what travels, so it excludes the codec's reduced-precision transfer (keep
// codec.dtype at fp32); under AMP the loss scaler unscales after finishBackward() as usual. With
// detect_unused the per-parameter flags travel in a collective of their own, never through the
// hook. name() is compared across ranks at construction (ranks with different hooks fail there).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct GradBucket {
  size_t index = 0;            // position in the bucket plan (0: launched first); the same on every rank
  int world = 1;               // ranks taking part: divide a sum by it for the average
  at::Tensor buffer;           // flat gradients; the result goes back here in finish()
  at::Tensor state;            // the hook's own, kept from launch() to finish()
  bool last = false;           // the step's last bucket
  std::vector<size_t> params;  // the parameters it holds (indices into DataParallel::params()), in order
  int64_t plan = 0;            // the plan's generation: another value means other buckets
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::shared_ptr<Work> launch(GradBucket& bucket, Transport& transport) = 0;
  virtual bool finish(GradBucket& bucket) = 0;
  // A short name, for describe() and the check that every rank runs the same hook.
  virtual std::string name() const = 0;
};

// A Work done when all of `works`, started on `transport`, are: waits for each in order; the first
// failure aborts `transport` before anything else is waited for (so the rest end at once instead
// of each waiting out its timeout), and is rethrown after all were waited for.
std::shared_ptr<Work> allOf(std::vector<std::shared_ptr<Work>> works, Transport& transport);

}  // namespace aiacc::comm
