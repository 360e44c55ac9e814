// The shortest decimal form that reads back as the same double: 0.1, not 0.10000000000000001.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace aiacc {

inline std::string shortestDouble(double v) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace aiacc
