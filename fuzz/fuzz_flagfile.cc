// A --flagfile on any bytes: gflags reads it (its own parser) into aiacc_train's flags, and
// aiacc's typed configuration is built from them (configFromFlags, distSpecFromFlags), which
// must refuse every bad value with a one-line InputError naming the flag. Each run starts from
// the flags' defaults (gflags::FlagSaver).
//
// Inputs that use gflags' own indirections (--fromenv, --tryfromenv, --flagfile) or its own
// commands (--help and its kinds, --version) are passed over: gflags reads the environment or
// another file for the first and, for a bad name such as "--tryfromenv=-", prints one line and
// calls exit(1) whatever errors_are_fatal says; for the second it prints and calls exit(0)
// (fuzz/corpus/fuzz_flagfile/ keeps an input of each). That is gflags' parser, not aiacc's, and
// its exit is what aiacc_train does too.
#include <gflags/gflags.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "aiacc/common/error.h"
#include "app/flags.h"
#include "fuzz/fuzz_util.h"

namespace {

// Whether the text may name one of gflags' indirections or commands. gflags' own line splitting
// (any leading whitespace skipped, a line ended at any '\r') is not repeated here: any mention is
// passed over.
bool leftToGflags(const std::string& text) {
  for (const char* name : {"fromenv", "flagfile", "help", "version"}) {
    if (text.find(name) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gflags::FlagSaver saver;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (leftToGflags(text)) return 0;
  if (!gflags::ReadFlagsFromString(text, "fuzz", /*errors_are_fatal=*/false)) return 0;
  try {
    aiacc::app::configFromFlags(aiacc::app::Recipe{});
    aiacc::app::distSpecFromFlags({});
  } catch (const aiacc::InputError& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
