// A --flagfile on any bytes: gflags reads it (its own parser) into aiacc_train's flags, and
// aiacc's typed configuration is built from them (configFromFlags, distSpecFromFlags), which
// must refuse every bad value with a one-line InputError naming the flag. Each run starts from
// the flags' defaults (gflags::FlagSaver).
#include <gflags/gflags.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "aiacc/common/error.h"
#include "app/flags.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gflags::FlagSaver saver;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!gflags::ReadFlagsFromString(text, "fuzz", /*errors_are_fatal=*/false)) return 0;
  try {
    aiacc::app::configFromFlags(aiacc::app::Recipe{});
    aiacc::app::distSpecFromFlags({});
  } catch (const aiacc::InputError& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
