#include "comm/grad_scale.h"

namespace aiacc::comm {

GradScale::GradScale(GradScaleOptions options) : opt_(options), value_(options.init_scale) {}

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
  value_ = value;
  good_steps_ = good_steps;
}

}  // namespace aiacc::comm
