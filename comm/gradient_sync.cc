#include "aiacc/comm/gradient_sync.h"

#include <cmath>

namespace aiacc::comm {

void checkCommState(const CommState& s, size_t params) {
  AIACC_CHECK_INPUT(std::isfinite(s.transfer_scale) && s.transfer_scale >= 0,
                    "a restored transfer scale must be positive and finite, or 0 (none), not ", s.transfer_scale);
  AIACC_CHECK_INPUT(s.transfer_good_steps >= 0, "a restored count of clean steps must be >= 0, not ",
                    s.transfer_good_steps);
  if (s.tuned) {
    AIACC_CHECK_INPUT(std::isfinite(s.tuned->bucket_mb) && s.tuned->bucket_mb > 0 && s.tuned->channels >= 1,
                      "a restored tuner choice needs a positive bucket cap and at least one channel (got ",
                      s.tuned->str(), ")");
  }
  double sum = 0;
  for (double w : s.channel_weights) {
    AIACC_CHECK_INPUT(std::isfinite(w) && w > 0, "a restored channel share must be positive and finite, not ", w);
    sum += w;
  }
  AIACC_CHECK_INPUT(s.channel_weights.empty() || std::abs(sum - 1) < 1e-9,
                    "restored channel shares must sum to 1 (they sum to ", sum, ")");
  if (s.bucket_order.empty() || params == 0) return;
  std::vector<char> seen(params, 0);
  bool permutation = s.bucket_order.size() == params;
  for (int64_t i : s.bucket_order) {
    permutation = permutation && i >= 0 && static_cast<size_t>(i) < params && !seen[static_cast<size_t>(i)];
    if (!permutation) break;
    seen[static_cast<size_t>(i)] = 1;
  }
  AIACC_CHECK_INPUT(permutation, "a restored bucket order must list each of the model's ", params,
                    " parameters once (it has ", s.bucket_order.size(), " entries)");
}

void GradientSync::broadcast(at::Tensor&, int root) {
  AIACC_CHECK(world().world == 1 && root == 0, "this GradientSync cannot broadcast over ", world().world, " ranks");
}

std::vector<std::string> GradientSync::restoreCommState(const CommState& s) {
  checkCommState(s, 0);
  std::vector<std::string> unused;
  if (s.transfer_scale != 0) {
    unused.push_back(strCat("the transfer scale (", s.transfer_scale,
                            ") is not used: this set-up's transfer has no scale of its own"));
  }
  if (s.tuned)
    unused.push_back(strCat("the tuner's choice (", s.tuned->str(), ") is not used: this set-up does not tune"));
  if (!s.channel_weights.empty()) {
    unused.push_back(strCat("the channel shares (", s.channel_weights.size(),
                            " channels) are not used: this set-up does not split buckets"));
  }
  if (!s.bucket_order.empty()) unused.push_back("the bucket order is not used: this set-up has no buckets");
  return unused;
}

}  // namespace aiacc::comm
