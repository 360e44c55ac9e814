// A minimal JSON object writer for reports and metrics lines (flat values and raw sub-objects).
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "common/json_escape.h"

namespace aiacc::app {

using ::aiacc::jsonEscape;

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& v) { return raw(key, "\"" + jsonEscape(v) + "\""); }
  JsonObject& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonObject& add(const std::string& key, double v) {
    if (!std::isfinite(v)) return raw(key, "null");
    std::ostringstream os;
    os.precision(10);
    os << v;
    return raw(key, os.str());
  }
  JsonObject& add(const std::string& key, int64_t v) { return raw(key, std::to_string(v)); }
  JsonObject& add(const std::string& key, int v) { return raw(key, std::to_string(v)); }
  JsonObject& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  // Inserts already-serialized JSON (an object or array) under key.
  JsonObject& raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ", ") + ("\"" + jsonEscape(key) + "\": ") + json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace aiacc::app
