// Every difference between the LibTorch versions aiacc builds against, in one place: Debian's
// 1.13 (CPU) and the 2.x wheels (2.11 with CUDA 13.0 in CI; 2.14 and later need C++20). Code
// elsewhere calls these names and never tests TORCH_VERSION_* itself.
//
// What differs, and since when:
//   - autocast's per-device setters (set_enabled, set_cpu_enabled, get_autocast_gpu_dtype, ...)
//     became calls taking the device type in 2.4;
//   - torch::optim::Optimizer::state() is keyed by the TensorImpl's address as a string
//     (c10::guts::to_string, removed in 2.2) in 1.x and by the address itself in 2.x. The key is
//     also what torch::optim's own serializer writes, which is why checkpoints do not use it
//     (app/checkpoint.h writes optimizer state by parameter position);
//   - c10d's Store writes keys also through append and multiSet from 2.1 (comm/key_log.cc records
//     every key written).
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cstdint>
#include <sstream>
#include <string>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define AIACC_TORCH_AUTOCAST_BY_DEVICE 1
#endif
#if TORCH_VERSION_MAJOR >= 2
#define AIACC_TORCH_OPTIM_KEY_IS_POINTER 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define AIACC_TORCH_STORE_HAS_APPEND 1
#endif

namespace aiacc::compat {

// "1.13.0", "2.11.0": the LibTorch these sources were compiled against.
inline const char* torchVersion() { return TORCH_VERSION; }

// ---- autocast ------------------------------------------------------------------------------

inline bool autocastEnabled(at::DeviceType d) {
#ifdef AIACC_TORCH_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(d);
#else
  return d == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline void setAutocastEnabled(at::DeviceType d, bool on) {
#ifdef AIACC_TORCH_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(d, on);
#else
  if (d == at::kCUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
#endif
}

inline at::ScalarType autocastDtype(at::DeviceType d) {
#ifdef AIACC_TORCH_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(d);
#else
  return d == at::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void setAutocastDtype(at::DeviceType d, at::ScalarType t) {
#ifdef AIACC_TORCH_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_dtype(d, t);
#else
  if (d == at::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(t);
  } else {
    at::autocast::set_autocast_cpu_dtype(t);
  }
#endif
}

// ---- torch::optim state keys ---------------------------------------------------------------

#ifdef AIACC_TORCH_OPTIM_KEY_IS_POINTER
using OptimStateKey = void*;
inline OptimStateKey optimStateKey(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }
#else
using OptimStateKey = std::string;
inline OptimStateKey optimStateKey(const at::Tensor& p) {
  std::ostringstream s;  // what c10::guts::to_string(void*) printed: "0x..." from operator<<
  s << static_cast<const void*>(p.unsafeGetTensorImpl());
  return s.str();
}
#endif

}  // namespace aiacc::compat
