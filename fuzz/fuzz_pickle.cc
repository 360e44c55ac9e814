// The restricted pickle machine (models/torch_unpickler.h) on any bytes, with every storage it
// asks for present (zeros, up to 64 Ki elements; a larger one is refused as a short record is).
// It must return a value or throw a one-line InputError, within the bounds its header states.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "aiacc/common/error.h"
#include "fuzz/fuzz_util.h"
#include "models/torch_unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const aiacc::models::StorageLoader load = [](const std::string& key, at::ScalarType dtype, int64_t numel) {
    AIACC_CHECK_INPUT(numel <= (int64_t{1} << 16), "storage ", key, " of ", numel, " elements");
    return at::zeros({numel}, at::TensorOptions().dtype(dtype));
  };
  try {
    aiacc::models::unpickleTorch(std::string(reinterpret_cast<const char*>(data), size), load);
  } catch (const aiacc::InputError& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
