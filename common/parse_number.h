// Numbers read from text that someone else wrote (recipes, flags, a checkpoint's settings, the
// environment), strictly: the whole text is one number in the type's range, or nothing.
// std::stoi and friends throw std::out_of_range with the message "stoi", which named no file and
// no line ("internal error: stoi"), and read "12abc" as 12; these return nullopt instead, for the
// caller's one-line error that names where the text came from.
#pragma once

#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
#include <system_error>

namespace aiacc {

// text as an integer of type T (decimal, an optional leading '-'); nullopt when it is empty, has
// anything else in it, or lies outside T's range.
template <typename T>
std::optional<T> parseInteger(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

// text as a finite double (decimal or exponent form); nullopt for anything else, inf and nan too.
inline std::optional<double> parseFinite(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty() || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace aiacc
