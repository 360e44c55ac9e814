#include "aiacc/comm/shm_segment.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace aiacc::comm::shm_segment {

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, long timeout_ns) {
  timespec ts{0, timeout_ns};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool procStat(pid_t pid, char* state, uint64_t* start) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t name_end = s.rfind(')');  // (the command name may hold spaces and parentheses)
  if (name_end == std::string::npos) return false;
  std::istringstream fields(s.substr(name_end + 1));
  std::string skip;
  fields >> *state;                             // field 3
  for (int i = 4; i < 22; ++i) fields >> skip;  // ppid ... itrealvalue
  fields >> *start;                             // field 22: start time, clock ticks after boot
  return !fields.fail();
}

}  // namespace aiacc::comm::shm_segment
