// Plain values for torch.save's format, as torch.load(weights_only=True) reads them under every
// PyTorch aiacc supports: dicts with string keys, lists, ints, bools, strings, None and tensors.
// Floating-point numbers are 0-dim float64 tensors, because torch 1.13's weights_only unpickler
// reads no pickled float (BINFLOAT); realOf also takes a float that Python wrote. Lists and dicts
// hold Any, so LibTorch's pickler writes them as plain Python lists and dicts (a typed list would
// be written as torch.jit._pickle.build_tensorlist, which weights_only refuses).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <string>

#include "aiacc/common/error.h"

namespace aiacc::models {

inline c10::impl::GenericDict plainDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}
inline c10::impl::GenericList plainList() { return c10::impl::GenericList(c10::AnyType::get()); }
inline c10::IValue real(double x) { return at::scalar_tensor(x, at::TensorOptions().dtype(at::kDouble)); }

// dict[key]; IoError naming `where` and the key when it is missing.
inline c10::IValue field(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const auto it = dict.find(c10::IValue(key));
  AIACC_CHECK_IO(it != dict.end(), where, " lacks '", key, "'");
  return it->value();
}

inline double realOf(const c10::IValue& v, const std::string& what) {
  if (v.isDouble()) return v.toDouble();
  AIACC_CHECK_IO(v.isTensor() && v.toTensor().numel() == 1 && v.toTensor().is_floating_point(), what,
                 " is not a number");
  return v.toTensor().item<double>();
}

inline int64_t intOf(const c10::IValue& v, const std::string& what) {
  AIACC_CHECK_IO(v.isInt(), what, " is a ", v.tagKind(), ", not an integer");
  return v.toInt();
}

// intOf within [lo, hi], for a value narrowed to a smaller type.
inline int64_t intIn(const c10::IValue& v, const std::string& what, int64_t lo, int64_t hi) {
  const int64_t i = intOf(v, what);
  AIACC_CHECK_IO(i >= lo && i <= hi, what, " is ", i, ", outside ", lo, " to ", hi);
  return i;
}

inline bool boolOf(const c10::IValue& v, const std::string& what) {
  AIACC_CHECK_IO(v.isBool(), what, " is a ", v.tagKind(), ", not a bool");
  return v.toBool();
}

inline c10::impl::GenericDict dictOf(const c10::IValue& v, const std::string& what) {
  AIACC_CHECK_IO(v.isGenericDict(), what, " is a ", v.tagKind(), ", not a dict");
  return v.toGenericDict();
}

inline c10::List<c10::IValue> listOf(const c10::IValue& v, const std::string& what) {
  AIACC_CHECK_IO(v.isList(), what, " is a ", v.tagKind(), ", not a list");
  return v.toList();
}

}  // namespace aiacc::models
