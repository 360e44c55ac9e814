#include "aiacc/comm/grad_scale.h"

#include <cmath>

#include "aiacc/common/error.h"

namespace aiacc::comm {

GradScale::GradScale(GradScaleOptions options) : opt_(options), value_(options.init_scale) {
  AIACC_CHECK_INPUT(std::isfinite(opt_.init_scale) && opt_.init_scale > 0,
                    "gradient scale: init_scale must be a positive finite number (got ", opt_.init_scale, ")");
  AIACC_CHECK_INPUT(std::isfinite(opt_.growth) && opt_.growth > 1,
                    "gradient scale: growth must be a finite number above 1 (got ", opt_.growth, ")");
  AIACC_CHECK_INPUT(opt_.backoff > 0 && opt_.backoff < 1,
                    "gradient scale: backoff must lie strictly between 0 and 1 (got ", opt_.backoff, ")");
  AIACC_CHECK_INPUT(opt_.growth_interval >= 1, "gradient scale: growth_interval must be at least 1 step (got ",
                    opt_.growth_interval, ")");
}

void GradScale::update(bool finite) {
  if (!finite) {
    value_ *= opt_.backoff;
    good_steps_ = 0;
    ++skipped_;
    return;
  }
  if (++good_steps_ >= opt_.growth_interval) {
    value_ *= opt_.growth;
    good_steps_ = 0;
  }
}

void GradScale::setState(double value, int64_t good_steps) {
  AIACC_CHECK_INPUT(std::isfinite(value) && value > 0,
                    "gradient scale: a restored scale must be a positive finite number (got ", value, ")");
  AIACC_CHECK_INPUT(good_steps >= 0, "gradient scale: a restored count of good steps must be >= 0 (got ", good_steps,
                    ")");
  value_ = value;
  good_steps_ = good_steps;
}

}  // namespace aiacc::comm
