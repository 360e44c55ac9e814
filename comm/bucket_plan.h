// Bucket assignment: a pure function of the parameter list, identical on every rank.
//
// Parameters are taken in reverse registration order (roughly the order backward produces their
// gradients), packed into buckets of at most `cap_bytes` (a parameter larger than the cap gets a
// bucket of its own), with a small first bucket (`first_cap_bytes`) so communication starts as
// early as possible in backward. Buckets hold parameters of one dtype only (a bucket is one flat
// tensor, and takes its type and device from its first parameter), and every parameter must be
// on one device: planBuckets refuses a list that is not, naming two parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aiacc::comm {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int dtype = 0;  // at::ScalarType as int
  int64_t numel = 0;
  int64_t element_size = 4;
  std::string device = "cpu";  // e.g. "cuda:0"; not part of the fingerprints (ranks use different GPUs)
};

struct BucketPlan {
  std::vector<std::vector<size_t>> buckets;  // parameter indices, in launch order
};

// order: parameter indices in the order to pack (e.g. reverse registration order); caps in bytes.
// Throws InputError when the parameters are not all on one device.
BucketPlan planBuckets(const std::vector<ParamInfo>& params, const std::vector<size_t>& order, int64_t first_cap_bytes,
                       int64_t cap_bytes);

// Reverse registration order: n-1, ..., 0.
std::vector<size_t> reverseOrder(size_t n);

// 64-bit fingerprint of names, shapes, dtypes and bucket boundaries (FNV-1a).
uint64_t planFingerprint(const std::vector<ParamInfo>& params, const BucketPlan& plan);

// Per-parameter fingerprints (name, shape, dtype), to find the first differing parameter.
uint64_t paramFingerprint(const ParamInfo& p);

}  // namespace aiacc::comm
