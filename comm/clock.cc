#include "aiacc/comm/clock.h"

#include <thread>

namespace aiacc::comm {
namespace {

class SteadyClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
  void sleepFor(duration d) const override { std::this_thread::sleep_for(d); }
};

}  // namespace

std::shared_ptr<const Clock> steadyClock() {
  static const std::shared_ptr<const Clock> clock = std::make_shared<SteadyClock>();  // (stateless, immutable)
  return clock;
}

}  // namespace aiacc::comm
