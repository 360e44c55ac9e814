#include "comm/timeline.h"

#include <cstdio>
#include <ostream>

#include "common/atomic_file.h"
#include "common/json_escape.h"

namespace aiacc::comm {
Timeline::Timeline(std::string path) : path_(std::move(path)), origin_(Clock::now()) {}

Timeline::~Timeline() {
  try {
    flush();
  } catch (const std::exception&) {
  }
}

double Timeline::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Timeline::span(const std::string& name, int row, Clock::time_point begin, Clock::time_point end,
                    const std::string& args_json) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "\"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f", row,
                micros(begin), micros(end) - micros(begin));
  std::string e = "{\"name\": \"" + jsonEscape(name) + "\", " + buf;
  if (!args_json.empty()) e += ", \"args\": " + args_json;
  e += "}";
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

void Timeline::instant(const std::string& name, int row, const std::string& args_json) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "\"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"tid\": %d, \"ts\": %.1f", row,
                micros(Clock::now()));
  std::string e = "{\"name\": \"" + jsonEscape(name) + "\", " + buf;
  if (!args_json.empty()) e += ", \"args\": " + args_json;
  e += "}";
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

void Timeline::nameRow(int row, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " + std::to_string(row) +
                    ", \"args\": {\"name\": \"" + jsonEscape(name) + "\"}}");
}

size_t Timeline::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  writeFileAtomicStream(path_, [this](std::ostream& f) {
    f << "[\n";
    for (size_t i = 0; i < events_.size(); ++i) f << events_[i] << (i + 1 < events_.size() ? ",\n" : "\n");
    f << "]\n";
  });
}

}  // namespace aiacc::comm
