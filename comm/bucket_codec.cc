#include "aiacc/comm/bucket_codec.h"

#include "aiacc/comm/half.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {

namespace {

class Fp32Codec : public BucketCodec {
 public:
  at::ScalarType wireType() const override { return at::kFloat; }
  bool direct(const at::Device&) const override { return false; }
  void encode(at::Tensor& bucket, at::Tensor&, int world) override { bucket.div_(world); }
  bool decode(const at::Tensor&, at::Tensor&) override { return true; }
  void encodeInto(const at::Tensor&, at::Tensor&, int) override {
    AIACC_CHECK(false, "fp32 transfer has no direct path");
  }
  bool decodeInto(const at::Tensor&, at::Tensor&) override {
    AIACC_CHECK(false, "fp32 transfer has no direct path");
    return false;
  }
  bool endStep(bool) override { return true; }
  bool shareScale(std::shared_ptr<GradScale>) override { return false; }
  TransferDtype dtype() const override { return TransferDtype::kFloat32; }
  double scale() const override { return 1; }
  int64_t skippedSteps() const override { return 0; }
};

// fp16 (scaled) and bf16 (unscaled) transfer.
class CastCodec : public BucketCodec {
 public:
  explicit CastCodec(const CodecOptions& o) : dtype_(o.dtype) {
    if (dtype_ == TransferDtype::kFloat16) {
      GradScaleOptions so;
      so.init_scale = o.grad_scale;
      so.growth_interval = o.scale_growth_steps;
      scale_ = std::make_shared<GradScale>(so);
    }
  }
  at::ScalarType wireType() const override { return half() ? at::kHalf : at::kBFloat16; }
  bool direct(const at::Device& device) const override { return device.is_cpu(); }

  void encode(at::Tensor& bucket, at::Tensor& wire, int world) override {
    wire.copy_(bucket.mul(outFactor(world)));  // on the bucket's device and current stream
  }
  bool decode(const at::Tensor& wire, at::Tensor& bucket) override {
    bucket.copy_(wire).mul_(inFactor());
    return at::isfinite(wire).all().item<bool>();
  }
  void encodeInto(const at::Tensor& grad, at::Tensor& wire_slot, int world) override {
    auto* out = static_cast<uint16_t*>(wire_slot.data_ptr());
    const auto n = static_cast<size_t>(grad.numel());
    if (half()) {
      floatToHalf(grad.data_ptr<float>(), out, n, outFactor(world));
    } else {
      floatToBf16(grad.data_ptr<float>(), out, n, outFactor(world));
    }
  }
  bool decodeInto(const at::Tensor& wire_slot, at::Tensor& grad) override {
    const auto* in = static_cast<const uint16_t*>(wire_slot.data_ptr());
    const auto n = static_cast<size_t>(grad.numel());
    return half() ? halfToFloat(in, grad.data_ptr<float>(), n, inFactor())
                  : bf16ToFloat(in, grad.data_ptr<float>(), n, inFactor());
  }
  bool endStep(bool finite) override {
    if (!finite) ++skipped_;
    if (scale_) scale_->update(finite);
    return finite;
  }
  bool shareScale(std::shared_ptr<GradScale> scale) override {
    if (!half()) return false;
    scale_ = std::move(scale);
    prescaled_ = true;
    return true;
  }
  GradScale* ownScale() const override { return prescaled_ ? nullptr : scale_.get(); }
  TransferDtype dtype() const override { return dtype_; }
  double scale() const override { return scale_ ? scale_->value() : 1.0; }
  int64_t skippedSteps() const override { return skipped_; }

 private:
  bool half() const { return dtype_ == TransferDtype::kFloat16; }
  // Gradients x outFactor() travel; the reduced wire x inFactor() is the averaged gradient.
  // Prescaled gradients already carry the scale: only the division by world size remains.
  float outFactor(int world) const { return static_cast<float>((prescaled_ ? 1.0 : scale()) / world); }
  float inFactor() const { return static_cast<float>(1.0 / scale()); }

  TransferDtype dtype_;
  std::shared_ptr<GradScale> scale_;  // fp16 only
  bool prescaled_ = false;
  int64_t skipped_ = 0;
};

}  // namespace

std::unique_ptr<BucketCodec> makeCodec(const CodecOptions& options) {
  if (options.dtype == TransferDtype::kFloat32) return std::make_unique<Fp32Codec>();
  return std::make_unique<CastCodec>(options);
}

}  // namespace aiacc::comm
