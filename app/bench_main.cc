// aiacc_bench: benchmarks users can run on their own machine and data.
//
//   aiacc_bench data --data DIR --image-size S --workers T [--images N] [--batch-size B]
//     decode + random-resized-crop + flip + normalize throughput of the training input pipeline
//     over DIR/train (or DIR itself when it has class folders), in images/s total and per
//     worker thread. scripts/bench_data.sh runs it beside torchvision on the same files.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "app/cli.h"
#include "common/error.h"
#include "data/image_folder.h"
#include "data/loader.h"

DEFINE_string(data, "", "folder of JPEGs in ImageNet layout (DIR/train/<class>/* or DIR/<class>/*)");
DEFINE_int32(image_size, 224, "output image size");
DEFINE_int32(workers, 1, "decode threads");
DEFINE_int32(batch_size, 64, "images per batch");
DEFINE_int64(images, 0, "stop after about this many images; 0: one pass over the folder");
DEFINE_double(min_scale, 0.08, "random-resized-crop minimum area fraction");
DEFINE_int32(repeat, 1, "passes over the folder (page cache warm after the first)");

namespace {

int benchData() {
  namespace fs = std::filesystem;
  AIACC_CHECK_INPUT(!FLAGS_data.empty(), "aiacc_bench data needs --data DIR");
  const std::string train = (fs::path(FLAGS_data) / "train").string();
  aiacc::data::ImageFolder folder =
      aiacc::data::scanImageFolder(fs::is_directory(train) ? train : FLAGS_data);
  const int64_t n = static_cast<int64_t>(folder.samples.size());
  aiacc::data::LoaderOptions o;
  o.train = true;
  o.workers = FLAGS_workers;
  o.prefetch = 2 * FLAGS_workers;
  auto skips = std::make_shared<aiacc::data::SkipLog>();
  aiacc::data::ImageLoader loader(std::move(folder), o, skips);
  // Warm-up pass over a few batches (page cache, allocator), not timed.
  loader.startEpoch({0, FLAGS_image_size, FLAGS_batch_size, FLAGS_min_scale});
  for (int i = 0; i < 2; ++i) loader.next();
  int64_t images = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < FLAGS_repeat; ++r) {
    loader.startEpoch({r + 1, FLAGS_image_size, FLAGS_batch_size, FLAGS_min_scale});
    while (auto b = loader.next()) {
      images += b->labels.numel();
      if (FLAGS_images > 0 && images >= FLAGS_images) break;
    }
    if (FLAGS_images > 0 && images >= FLAGS_images) break;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ips = static_cast<double>(images) / s;
  std::printf("aiacc data: %lld images of %lld files at %d px, %d workers: %.1f images/s total, "
              "%.1f images/s per worker (%lld skipped)\n",
              static_cast<long long>(images), static_cast<long long>(n), FLAGS_image_size,
              FLAGS_workers, ips, ips / FLAGS_workers, static_cast<long long>(skips->count()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> rest = aiacc::app::parseCommandLine(
      argc, argv, "aiacc_bench data --data DIR --image-size S --workers T");
  if (rest.size() < 2 || rest[1] != "data") {
    std::cerr << "usage: aiacc_bench data --data DIR [--image-size S] [--workers T] [--images N]\n"
                 "(the allreduce benchmark arrives with the comm module)\n";
    return 2;
  }
  try {
    return benchData();
  } catch (const aiacc::Error& e) {
    std::cerr << "aiacc_bench: error: " << e.what() << "\n";
    return 1;
  }
}
