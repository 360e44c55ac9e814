// The shortest decimal form that reads back as the same double: 0.1, not 0.10000000000000001;
// 20, not 2e+01 (std::to_chars: the fewest significant digits that round-trip, then fixed or
// scientific notation, whichever is shorter). NaN and infinities as "nan", "inf", "-inf".
#pragma once

#include <charconv>
#include <string>

namespace aiacc {

inline std::string shortestDouble(double v) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

}  // namespace aiacc
