// The one error family of aiacc, and the AIACC_CHECK macros.
//
// Contract: code below app/ never exits the process; it throws an aiacc::Error (or subclass)
// whose what() is one line a user can act on. Errors caught on background threads are stored and
// rethrown on the thread that waits for the work.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace aiacc {

// s as one line: a line break becomes the two characters "\n" ("\r" likewise) and any other
// control byte '?'. Every aiacc error's message goes through it, so that a name read from a
// crafted file (a tensor called "fc\n.bias") cannot break the one-line contract above.
inline std::string oneLine(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
      out += '?';
    } else {
      out += c;
    }
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(oneLine(what)) {}
};

// Bad user input: flags, files, folders, configurations.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what) {}
};

// Input/output failure: disk full, unreadable checkpoint, broken pipe.
class IoError : public Error {
 public:
  explicit IoError(const std::string& what) : Error(what) {}
};

namespace detail {
inline void streamAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void streamAll(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  streamAll(os, rest...);
}
}  // namespace detail

// The first line of a message: LibTorch's and Gloo's errors carry a backtrace or context after it,
// and aiacc's messages are one line.
inline std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Builds a message from any streamable pieces: strCat("read ", n, " bytes").
template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  detail::streamAll(os, args...);
  return os.str();
}

}  // namespace aiacc

#define AIACC_THROW(ErrorType, ...) throw ErrorType(::aiacc::strCat(__VA_ARGS__))

#define AIACC_CHECK(cond, ...)                                                                \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      AIACC_THROW(::aiacc::Error, "check failed: " #cond ": ", ::aiacc::strCat(__VA_ARGS__)); \
    }                                                                                         \
  } while (0)

#define AIACC_CHECK_INPUT(cond, ...)                            \
  do {                                                          \
    if (!(cond)) AIACC_THROW(::aiacc::InputError, __VA_ARGS__); \
  } while (0)

#define AIACC_CHECK_IO(cond, ...)                            \
  do {                                                       \
    if (!(cond)) AIACC_THROW(::aiacc::IoError, __VA_ARGS__); \
  } while (0)
