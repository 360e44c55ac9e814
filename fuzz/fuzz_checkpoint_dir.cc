// A checkpoint folder on any bytes (common/checkpoint_dir.h): the input, cut at its first two
// NUL bytes, becomes `latest`, one step's manifest and that step's payload; findNewestValid must
// pick a checkpoint whose manifest checks out, or none, and report each rejected file in one line.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "aiacc/common/checkpoint_dir.h"
#include "aiacc/common/error.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t a = all.find('\0'), b = a == std::string::npos ? a : all.find('\0', a + 1);
  const std::string latest = all.substr(0, a);
  const std::string manifest = a == std::string::npos ? "" : all.substr(a + 1, b == std::string::npos ? b : b - a - 1);
  const std::string payload = b == std::string::npos ? "" : all.substr(b + 1);
  const std::string dir = aiacc::fuzz::scratch() + "/ckpt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto put = [&](const std::string& name, const std::string& bytes) {
    aiacc::fuzz::scratchFile("ckpt/" + name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  };
  put("latest", latest);
  put(aiacc::checkpointManifestName(7), manifest);
  put(aiacc::checkpointPayloadName(7), payload);
  try {
    const auto found = aiacc::findNewestValid(dir,
                                              [](const std::string& line) { aiacc::fuzz::checkOneLine(line.c_str()); });
    if (found && found->step != 7) std::abort();  // the only step there is
  } catch (const aiacc::Error& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
