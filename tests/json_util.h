// Reading what aiacc writes as JSON, for tests: parsed (nlohmann-json), never searched as text.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "aiacc/common/json.h"
#include "tests/test_util.h"

namespace aiacc::test {

// A whole JSON file (a report, a timeline, args.json); a parse error fails with the file named.
inline Json readJson(const std::string& path) {
  const std::string text = readText(path);
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw std::runtime_error("not JSON: " + path + ": " + e.what() + "\n" + text);
  }
}

// The lines of a JSON-lines file (--metrics-file) whose "type" is `type` ("" for every line).
inline std::vector<Json> jsonLines(const std::string& path, const std::string& type = "") {
  std::vector<Json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    Json j = Json::parse(line);  // throws on a line that is not JSON: the test fails
    if (type.empty() || j.value("type", "") == type) out.push_back(std::move(j));
  }
  return out;
}

// The numbers under `key` in the --metrics-file lines of the given type. A non-finite value is
// written as null: read back as NaN, never as 0 (which once turned a run that went NaN at step 2
// into a "mean loss" of a fraction of the real one).
inline std::vector<double> metricValues(const std::string& path, const std::string& type, const std::string& key) {
  std::vector<double> out;
  for (const Json& j : jsonLines(path, type)) {
    if (!j.contains(key)) continue;
    out.push_back(j[key].is_null() ? std::nan("") : j[key].get<double>());
  }
  return out;
}

}  // namespace aiacc::test
