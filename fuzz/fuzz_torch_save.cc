// A torch.save zip archive on any bytes, as --init-weights, --convert-weights and --resume read
// them: the archive (LibTorch's zip reader), its pickle and storages (models/torch_unpickler.h),
// and the state dict or aiacc weights file made of them (models/torch_format.h, models/weights.h,
// through a file: readWeightsFile tells the formats apart by their first bytes). Bad bytes end
// in a one-line InputError or IoError. With AIACC_FUZZ_WRITE_SEEDS=DIR set, the target first
// writes seeds there: a state dict in torch.save's format and in aiacc's own, written by aiacc.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "aiacc/common/error.h"
#include "fuzz/fuzz_util.h"
#include "models/torch_format.h"
#include "models/torch_unpickler.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("AIACC_FUZZ_WRITE_SEEDS")) {
    const aiacc::models::NamedTensors tensors = {{"fc.weight", at::arange(6, at::kFloat).view({2, 3})},
                                                 {"fc.bias", at::zeros({2})},
                                                 {"bn.num_batches_tracked", at::tensor(int64_t{3})}};
    aiacc::models::writeTorchStateDict(std::string(dir) + "/state_dict.pt", tensors);
    aiacc::models::writeNamedTensors(std::string(dir) + "/weights.aiaccw", tensors);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    aiacc::models::readTorchSaveBytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.pt");
  } catch (const aiacc::Error& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  try {
    aiacc::models::readWeightsFile(aiacc::fuzz::scratchFile("weights", data, size));
  } catch (const aiacc::Error& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  return 0;
}
