// aiacc_train: trains ResNet v1.5 on an ImageNet-layout folder and reports time to a target
// accuracy, DAWNBench style. Reads top-down: flags -> (sample generation) -> trainer -> report.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <chrono>
#include <cstring>
#include <iostream>

#include "app/cli.h"
#include "app/flags.h"
#include "app/report.h"
#include "app/trainer.h"
#include "common/error.h"
#include "data/sample_gen.h"

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "-help")) {
      aiacc::app::printHelp(argv[0]);
      return 0;
    }
  }
  const std::vector<std::string> rest =
      aiacc::app::parseCommandLine(argc, argv, "trains ResNet v1.5 to a target accuracy; see --help");
  if (rest.size() > 1) {
    std::cerr << "aiacc_train: unexpected argument '" << rest[1] << "' (flags start with --; see --help)\n";
    return 2;
  }
  try {
    if (!aiacc::app::makeSampleFlag().empty()) {
      const aiacc::data::SampleSpec spec = aiacc::app::sampleSpecFromFlags();
      aiacc::data::makeSampleDataset(aiacc::app::makeSampleFlag(), spec);
      std::cout << "wrote sample dataset to " << aiacc::app::makeSampleFlag() << " ("
                << spec.classes << " classes, " << spec.train_per_class << " train + "
                << spec.val_per_class << " val images per class)\n";
      return 0;
    }
    aiacc::app::Config config = aiacc::app::configFromFlags();
    aiacc::comm::LocalSync sync;
    aiacc::app::Trainer trainer(config, sync, start);
    aiacc::app::Report report = trainer.run();
    aiacc::app::printReport(report, std::cout);
    if (!config.report_file.empty()) {
      aiacc::app::writeFileAtomic(config.report_file, aiacc::app::reportJson(report, config) + "\n");
    }
    if (!config.dawnbench_dir.empty()) aiacc::app::writeDawnbench(config.dawnbench_dir, report, config);
    const bool wanted_target = config.target_top1 > 0 || config.target_top5 > 0;
    return wanted_target && !report.target_reached ? 3 : 0;
  } catch (const aiacc::Error& e) {
    std::cerr << "aiacc_train: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << "aiacc_train: internal error: " << what.substr(0, what.find('\n')) << "\n";
    return 1;
  }
}
