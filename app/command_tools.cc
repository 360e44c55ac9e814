#include "app/command_tools.h"

#include <iostream>

#include "app/exit_code.h"
#include "app/flags.h"
#include "data/sample_gen.h"
#include "models/torch_format.h"

namespace aiacc::app {

bool toolRequested() { return !makeSampleFlag().empty() || !convertWeightsFlags().first.empty(); }

int runTool(bool dry_run) {
  if (!makeSampleFlag().empty()) {
    const data::SampleSpec spec = sampleSpecFromFlags();
    if (dry_run) {
      std::cout << "aiacc_train --dry-run: would write the sample dataset to " << makeSampleFlag() << "\n";
      return 0;
    }
    data::makeSampleDataset(makeSampleFlag(), spec);
    std::cout << "wrote sample dataset to " << makeSampleFlag() << " (" << spec.classes << " classes, "
              << spec.train_per_class << " train + " << spec.val_per_class << " val images per class)\n";
    return 0;
  }
  const auto [in, out] = convertWeightsFlags();
  if (out.empty()) {
    std::cerr << "aiacc_train: error: --convert-weights needs --save-weights OUT (the file to write)\n";
    return exitCode(Ending{Ending::How::kUsage});
  }
  if (dry_run) {
    std::cout << "aiacc_train --dry-run: would convert " << in << " to " << out << "\n";
    return 0;
  }
  const size_t n = models::convertWeightsFile(in, out);
  std::cout << "wrote " << n << " tensors from " << in << " to " << out << "\n";
  return 0;
}

}  // namespace aiacc::app
