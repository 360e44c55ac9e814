#include "aiacc/comm/bucket_plan.h"

#include "aiacc/common/error.h"

namespace aiacc::comm {
namespace {
void fnv(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
}
template <typename T>
void fnvValue(uint64_t& h, T v) {
  fnv(h, &v, sizeof(v));
}
}  // namespace

std::vector<size_t> reverseOrder(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

BucketPlan planBuckets(const std::vector<ParamInfo>& params, const std::vector<size_t>& order, int64_t first_cap_bytes,
                       int64_t cap_bytes) {
  AIACC_CHECK(order.size() == params.size(), "order covers ", order.size(), " of ", params.size());
  AIACC_CHECK(cap_bytes > 0 && first_cap_bytes > 0, "bucket caps must be positive");
  for (const ParamInfo& p : params) {
    AIACC_CHECK_INPUT(p.device == params.front().device, "DataParallel: parameters '", params.front().name, "' (",
                      params.front().device, ") and '", p.name, "' (", p.device,
                      ") are on different devices; a bucket is one tensor on one device: put every parameter of "
                      "the module on the same device");
  }
  BucketPlan plan;
  std::vector<size_t> current;
  int64_t bytes = 0;
  int dtype = -1;
  for (size_t idx : order) {
    const ParamInfo& p = params.at(idx);
    const int64_t b = p.numel * p.element_size;
    const int64_t cap = plan.buckets.empty() ? first_cap_bytes : cap_bytes;
    if (!current.empty() && (bytes + b > cap || p.dtype != dtype)) {
      plan.buckets.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
    current.push_back(idx);
    bytes += b;
    dtype = p.dtype;
  }
  if (!current.empty()) plan.buckets.push_back(std::move(current));
  return plan;
}

uint64_t paramFingerprint(const ParamInfo& p) {
  uint64_t h = 1469598103934665603ull;
  fnv(h, p.name.data(), p.name.size());
  for (int64_t d : p.shape) fnvValue(h, d);
  fnvValue(h, p.dtype);
  return h;
}

uint64_t planFingerprint(const std::vector<ParamInfo>& params, const BucketPlan& plan) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : params) fnvValue(h, paramFingerprint(p));
  for (const auto& b : plan.buckets) {
    fnvValue(h, static_cast<uint64_t>(b.size()));
    for (size_t i : b) fnvValue(h, static_cast<uint64_t>(i));
  }
  return h;
}

}  // namespace aiacc::comm
