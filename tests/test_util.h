// Shared test helpers: a self-deleting temporary folder and small file writers.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

// The numbers under `key` in the --metrics-file lines of the given type ("step" or "eval").
inline std::vector<double> metricValues(const std::string& path, const std::string& type,
                                        const std::string& key) {
  std::vector<double> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.find("\"type\": \"" + type + "\"") == std::string::npos) continue;
    const size_t at = line.find("\"" + key + "\": ");
    if (at != std::string::npos) out.push_back(std::strtod(line.c_str() + at + key.size() + 4, nullptr));
  }
  return out;
}

// Folder of the test sources (for scripts the tests call).
inline std::string sourceDir() { return AIACC_SOURCE_DIR; }

}  // namespace aiacc::test
