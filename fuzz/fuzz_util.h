// What the fuzz targets share: a scratch folder of this process (path-based parsers read files),
// and the contract every target checks, that bad bytes end in one of aiacc's one-line errors.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace aiacc::fuzz {

// A folder of this process under TMPDIR (libFuzzer's -jobs run several processes), made once.
inline const std::string& scratch() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d = std::string(tmp && *tmp ? tmp : "/tmp") + "/aiacc-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes bytes to scratch()/name and returns its path.
inline std::string scratchFile(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                static_cast<std::streamsize>(size));
  return path;
}

// An error message that breaks the one-line contract: a crash for the fuzzer to report.
inline void checkOneLine(const char* what) {
  for (const char* p = what; *p; ++p) {
    if (*p == '\n') {
      std::fprintf(stderr, "an error of more than one line: %s\n", what);
      std::abort();
    }
  }
}

}  // namespace aiacc::fuzz
