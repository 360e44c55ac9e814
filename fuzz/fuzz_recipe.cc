// A --recipe file on any bytes (app/flags.h: applyRecipe), then the configuration built from the
// flags it set (configFromFlags, distSpecFromFlags): every bad line or value is a one-line
// InputError naming the file and line or the flag, never a crash or an uncaught std:: exception.
// Each run starts from the flags' defaults (gflags::FlagSaver).
#include <gflags/gflags.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "aiacc/common/error.h"
#include "app/flags.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gflags::FlagSaver saver;
  const std::string path = aiacc::fuzz::scratchFile("fuzz.recipe", data, size);
  try {
    aiacc::app::Recipe r;
    r.path = path;
    r.stages = aiacc::app::applyRecipe(path, &r.text);
    aiacc::app::configFromFlags(r);
    aiacc::app::distSpecFromFlags({});
  } catch (const aiacc::InputError& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
