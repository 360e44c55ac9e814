// Storages as torch.save writes them, for the pickle reader (models/torch_unpickler.h): the
// storage classes aiacc reads and their element types, and which strided views of a storage it
// reads (a pure function, so that the rule is tested on its own).
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aiacc/common/error.h"

namespace aiacc::models {

// The element type of a storage class ("torch.FloatStorage"); nullopt for one aiacc does not read.
inline std::optional<at::ScalarType> storageDtype(const std::string& cls) {
  static const std::map<std::string, at::ScalarType> types = {{"torch.FloatStorage", at::kFloat},
                                                              {"torch.DoubleStorage", at::kDouble},
                                                              {"torch.HalfStorage", at::kHalf},
                                                              {"torch.BFloat16Storage", at::kBFloat16},
                                                              {"torch.LongStorage", at::kLong},
                                                              {"torch.IntStorage", at::kInt},
                                                              {"torch.ShortStorage", at::kShort},
                                                              {"torch.CharStorage", at::kChar},
                                                              {"torch.ByteStorage", at::kByte},
                                                              {"torch.BoolStorage", at::kBool},
                                                              {"torch.ComplexFloatStorage", at::kComplexFloat},
                                                              {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  const auto it = types.find(cls);
  return it == types.end() ? std::nullopt : std::optional<at::ScalarType>(it->second);
}

// "" when the view (size, stride, offset) lies inside a storage of storage_numel elements and no
// two of its indexes share an element; else why not, in a few words. Every extent is computed in
// overflow-checked arithmetic. A view of no element (a size 0) is read whatever its offset. The
// dimensions of more than one element, taken by stride, must each step over the whole extent of
// those inside them: so a non-overlapping view that interleaves (size (2, 3), stride (3, 2)) is
// refused too, which no saved tensor is.
inline std::string viewRefusal(const std::vector<int64_t>& size, const std::vector<int64_t>& stride, int64_t offset,
                               int64_t storage_numel) {
  if (size.size() != stride.size())
    return strCat("a tensor of ", size.size(), " sizes and ", stride.size(), " strides");
  if (size.size() > 64) return strCat("a tensor of ", size.size(), " dimensions");
  if (offset < 0) return "a tensor at a negative offset";
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  bool empty = false;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] < 0 || stride[i] < 0) return "a negative size or stride";
    empty = empty || size[i] == 0;
    if (size[i] > 1) dims.emplace_back(stride[i], size[i]);
  }
  if (empty) return "";
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements from the first to one past the last, of the dimensions so far
  for (const auto& [st, n] : dims) {
    if (st < extent) {
      return strCat("a tensor view whose elements overlap or interleave (stride ", st, " over ", n,
                    " elements: an expanded or broadcast tensor saved as a view), which aiacc does not read; "
                    "re-save it with .contiguous()");
    }
    int64_t span;
    if (__builtin_mul_overflow(n - 1, st, &span) || __builtin_add_overflow(span, int64_t{1}, &extent)) {
      return "a tensor reaching past 2^63 elements";
    }
  }
  int64_t end;
  if (__builtin_add_overflow(offset, extent, &end) || end > storage_numel) {
    return strCat("a tensor reaching past its storage of ", storage_numel, " elements");
  }
  return "";
}

}  // namespace aiacc::models
