// JSON as aiacc writes and reads it: nlohmann-json with keys kept in the order they were added
// (reports and metrics lines read top-down), one line per value.
//
// Include from .cc files only: no installed header (comm's public surface) may depend on it.
// Guarantees of toJsonLine():
// - doubles round-trip (the shortest representation that reads back to the same value);
// - NaN and infinities become null (JSON has no spelling for them);
// - bytes that are not valid UTF-8 (a path from the file system need not be) become U+FFFD,
//   so the output is always valid JSON, never an exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace aiacc {

using Json = nlohmann::ordered_json;

inline std::string toJsonLine(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Indented (2 spaces) for files people open by hand (args.json).
inline std::string toJsonText(const Json& j) { return j.dump(2, ' ', false, Json::error_handler_t::replace); }

}  // namespace aiacc
