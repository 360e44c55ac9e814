#include "aiacc/comm/timeline.h"

#include <cmath>
#include <ostream>

#include "aiacc/common/atomic_file.h"
#include "aiacc/common/json.h"

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

namespace {
// Names and arguments may hold any bytes (a tensor's or a host's name): toJsonLine makes them
// valid JSON whatever they hold.
Json event(const std::string& name, const char* phase, int row, double ts, const Timeline::Args& args) {
  Json e{{"name", name}, {"ph", phase}, {"pid", 0}, {"tid", row}, {"ts", std::round(ts * 10) / 10}};
  if (!args.empty()) {
    Json a = Json::object();
    for (const auto& [key, value] : args) a[key] = value;
    e["args"] = std::move(a);
  }
  return e;
}
}  // namespace

void Timeline::span(const std::string& name, int row, Clock::time_point begin, Clock::time_point end,
                    const Args& args) {
  Json e = event(name, "X", row, micros(begin), args);
  e["dur"] = std::round((micros(end) - micros(begin)) * 10) / 10;
  std::string line = toJsonLine(e);
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(line));
}

void Timeline::instant(const std::string& name, int row, const Args& args) {
  Json e = event(name, "i", row, micros(Clock::now()), args);
  e["s"] = "g";
  std::string line = toJsonLine(e);
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(line));
}

void Timeline::nameRow(int row, const std::string& name) {
  std::string line = toJsonLine(Json{
      {"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", row}, {"args", {{"name", name}}}});
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(line));
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
