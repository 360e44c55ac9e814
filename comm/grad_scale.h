// GradScale: the one dynamic gradient scale of a job, and its arithmetic.
//
// Gradients travel or are computed multiplied by value() so that small ones do not flush to zero
// in fp16. After a step, update() is told whether every gradient was finite: on overflow the step
// is skipped (counted) and the scale is multiplied by `backoff`; after `growth_interval` finite
// steps in a row it is multiplied by `growth`. Both owners of a scale use this object: the fp16
// transfer (CodecOptions) when it scales gradients for the wire itself, and the AMP
// loss scaler (aiacc_train's), which can hand its scale to DataParallel so that the loss scale and the
// transfer scale are one and the same (DataParallel::shareLossScale).
//
// Pure arithmetic, no collective: every rank sees the same reduced gradients, so every rank
// calls update() with the same verdict and holds the same scale. Not thread-safe (training thread).
#pragma once

#include <cstdint>

namespace aiacc::comm {

struct GradScaleOptions {
  double init_scale = 65536.0;     // 2^16, PyTorch's GradScaler default; positive, finite
  double growth = 2.0;             // > 1 (finite)
  double backoff = 0.5;            // in (0, 1)
  int64_t growth_interval = 2000;  // >= 1
};

class GradScale {
 public:
  // Throws InputError (one line naming the option and its value) for options out of range.
  explicit GradScale(GradScaleOptions options = {});

  double value() const { return value_; }
  // After a step: `finite` false skips it (counted) and backs off; true counts a good step and
  // grows the scale after growth_interval of them in a row.
  void update(bool finite);
  int64_t goodSteps() const { return good_steps_; }
  int64_t skippedSteps() const { return skipped_; }
  // Checkpointed state; InputError for a scale that is not positive and finite, or good_steps < 0.
  void setState(double value, int64_t good_steps);

 private:
  GradScaleOptions opt_;
  double value_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace aiacc::comm
