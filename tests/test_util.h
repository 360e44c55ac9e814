// Shared test helpers: a self-deleting temporary folder, small file writers, shell commands.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "tests/build_paths.h"

namespace aiacc::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "aiacc_test_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline void writeFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void writeText(const std::string& path, const std::string& text) {
  writeFile(path, std::vector<uint8_t>(text.begin(), text.end()));
}

inline std::string readText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The checkpoint a checkpoint folder's `latest` names (common/checkpoint_dir.h), as a path.
inline std::string newestCheckpoint(const std::string& dir) {
  std::string name = readText(dir + "/latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return dir + "/" + name;
}

// The names of the entries of `dir`, sorted.
inline std::vector<std::string> namesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Folder of the test sources (for scripts the tests call).
inline std::string sourceDir() { return AIACC_SOURCE_DIR; }

// Whether `part` occurs in `s` (error messages, logs).
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
// How many times `part` (not empty) starts in `s`.
inline int occurrences(const std::string& s, const std::string& part) {
  int n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// What fn() throws as an E (its what()), or `none` when it returns: a refusal's message.
template <class E, class F>
std::string messageOf(F&& fn, const std::string& none = "ok") {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return none;
}

// Runs a shell command; returns its exit code and stdout.
inline std::pair<int, std::string> runShell(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WEXITSTATUS(status), out};
}

// Runs the aiacc_train this build made with `args`; returns its exit code and its output
// (stdout and stderr together).
inline std::pair<int, std::string> runTrain(const std::string& args) {
  return runShell(std::string(AIACC_TRAIN_BIN) + " " + args + " 2>&1");
}

// Shell: waits until the shell test `test` holds, looking every 50 ms for at most `seconds`, and
// leaving early once `unless` (a command) fails, e.g. "kill -0 $L" (its process ended); ends in "; ".
inline std::string shellWaitUntil(const std::string& test, int seconds = 120, const std::string& unless = "") {
  return "for i in $(seq " + std::to_string(seconds * 20) + "); do " + test + " && break; " +
         (unless.empty() ? "" : unless + " 2> /dev/null || break; ") + "sleep 0.05; done; ";
}

// A process that a test hook holds (AIACC_TEST_HOLD_*, app/test_hooks.h) writes RELEASE.held.<pid>,
// then waits until the file RELEASE exists. Shell: a test that at least `n` of them are held.
inline std::string shellHeld(const std::string& release, int n) {
  return "[ \"$(ls " + release + ".held.* 2> /dev/null | wc -l)\" -ge " + std::to_string(n) + " ]";
}

// The line aiacc_train's launcher writes once it has passed a signal on to its workers (each has
// its stop flag then): a job held at a step may be let go.
constexpr const char* kForwardedLine = "; forwarding it to the ";

// A loopback port nobody listens on now (the kernel's pick for port 0): tests run in parallel.
inline int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace aiacc::test
