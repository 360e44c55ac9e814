// BucketCodec: the form in which a bucket of gradients travels, and back (the place of c10d's
// comm hooks). The Reducer (comm/reducer.h) fills buckets and launches their allreduce; the codec
// decides what goes on the wire and how the reduced wire becomes averaged gradients:
//   - fp32: the bucket itself travels, divided by world size;
//   - fp16: gradients x (scale / world size) cast to fp16, reduced, cast back and divided by the
//     scale; the scale is a GradScale (comm/grad_scale.h), the codec's own or one it shares with
//     the AMP loss scaler, in which case the gradients arrive already multiplied by it and only
//     the division by world size happens on the way out;
//   - bf16: the same cast without a scale (bf16 has fp32's range; what it lacks is mantissa,
//     which scaling cannot give).
// A reduced-precision wire is checked for inf/NaN after the reduce. Every rank holds the same
// reduced values, so every rank reaches the same verdict without exchanging a word; endStep()
// then says whether the step stands and moves the scale.
//
// Two paths: staged (an fp32 bucket beside the wire; used for fp32, and on the GPU, where the
// casts run on the device) and direct (CPU fp16/bf16: each gradient converts straight into its
// wire slot and back into .grad, two passes over the gradients fewer). Calls only comm/half.h and
// ATen; no communication.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "aiacc/comm/grad_scale.h"
#include "aiacc/comm/options.h"

namespace aiacc::comm {

class BucketCodec {
 public:
  virtual ~BucketCodec() = default;

  // Element type on the wire: kFloat (the fp32 bucket itself travels), kHalf or kBFloat16.
  virtual at::ScalarType wireType() const = 0;
  // True when gradients of parameters on `device` convert straight into the wire (no fp32 bucket).
  virtual bool direct(const at::Device& device) const = 0;

  // Staged path. Before the allreduce: `bucket` holds the bucket's fp32 gradients (zeros where a
  // parameter has none); `wire` (the bucket itself when wireType() is kFloat) receives what
  // travels. After it: `bucket` receives the averaged fp32 gradients; false when any is not finite.
  virtual void encode(at::Tensor& bucket, at::Tensor& wire, int world) = 0;
  virtual bool decode(const at::Tensor& wire, at::Tensor& bucket) = 0;

  // Direct path, one gradient at a time: a contiguous fp32 gradient into its wire slot, and the
  // reduced slot back into a contiguous fp32 tensor (false when any value is not finite).
  virtual void encodeInto(const at::Tensor& grad, at::Tensor& wire_slot, int world) = 0;
  virtual bool decodeInto(const at::Tensor& wire_slot, at::Tensor& grad) = 0;

  // After every bucket of a step was decoded: whether the step stands (false: every rank skips
  // it). Moves the scale, where there is one.
  virtual bool endStep(bool finite) = 0;

  // From now on gradients arrive already multiplied by `scale` (the AMP loss scale): the codec
  // divides by it after the reduce and moves it in endStep(). Returns false when this codec has no
  // use for a scale (fp32, bf16: the loss scaler then unscales after the reduce as usual).
  virtual bool shareScale(std::shared_ptr<GradScale> scale) = 0;

  // The codec's own scale: fp16 transfer's until shareScale(); null for fp32 and bf16, and once the
  // AMP loss scale is shared (its owner saves it). What a checkpoint carries of the codec.
  virtual GradScale* ownScale() const { return nullptr; }

  virtual TransferDtype dtype() const = 0;
  // The scale in use (1 without one); steps skipped for a non-finite reduce.
  virtual double scale() const = 0;
  virtual int64_t skippedSteps() const = 0;
};

std::unique_ptr<BucketCodec> makeCodec(const CodecOptions& options);

}  // namespace aiacc::comm
