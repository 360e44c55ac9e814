// Timeline: a Chrome-trace JSON file (open in Perfetto or chrome://tracing) of what each step
// spent its time on: compute spans (forward, backward, optimizer) on one row, each
// communication channel's operations on a row of its own, decisions as instant events.
//
// Thread-safe; events are buffered and written by flush() (also on destruction), as one JSON
// array, so a crashed run leaves no half-written file behind (a temporary
// file, fsynced and renamed into place; flush() throws IoError naming the path when it cannot).
#pragma once

#include <chrono>
#include <mutex>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace aiacc::comm {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  // An event's arguments (shown by the viewer): named integers, in this order.
  using Args = std::vector<std::pair<std::string, int64_t>>;
  explicit Timeline(std::string path);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A complete span on row `row` ("compute" is row 0; channel c is row 1 + c).
  void span(const std::string& name, int row, Clock::time_point begin, Clock::time_point end, const Args& args = {});
  void instant(const std::string& name, int row, const Args& args = {});
  // Names a row (shown by the viewer).
  void nameRow(int row, const std::string& name);
  void flush();
  size_t events() const;

 private:
  double micros(Clock::time_point t) const;
  std::string path_;
  Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<std::string> events_;
};

}  // namespace aiacc::comm
