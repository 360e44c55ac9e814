// aiacc_bench: benchmarks users can run on their own machine and data.
//
//   aiacc_bench data --data DIR --image-size S --workers T [--images N] [--batch-size B]
//     decode + random-resized-crop + flip + normalize throughput of the training input pipeline
//     over DIR/train (or DIR itself when it has class folders), in images/s total and per
//     worker thread. scripts/bench_data.sh runs it beside torchvision on the same files.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "app/cli.h"
#include "app/launcher.h"
#include "comm/gloo_transport.h"
#include "comm/store.h"
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
DEFINE_int32(nproc, 2, "allreduce: ranks (processes) on this machine");
DEFINE_int32(streams, 2, "allreduce: channels the aiacc mode splits each buffer across");
DEFINE_double(max_mb, 256, "allreduce: largest buffer, MiB");
DEFINE_string(master, "127.0.0.1:29591", "allreduce: host:port of the rendezvous store");

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

// One rank of the allreduce benchmark.
int benchAllreduceWorker(const aiacc::comm::WorldInfo& w) {
  const auto [host, port] = aiacc::app::parseHostPort(FLAGS_master);
  aiacc::comm::StoreOptions so;
  so.host = host;
  so.port = port;
  so.rank = w.rank;
  so.world = w.world;
  auto store = aiacc::comm::makeTcpStore(so);
  aiacc::comm::GlooOptions go;
  go.rank = w.rank;
  go.world = w.world;
  go.channels = FLAGS_streams;
  aiacc::comm::GlooTransport t(store, go);
  const int K = FLAGS_streams;
  auto barrier = [&] {
    at::Tensor z = at::zeros({1}, at::kFloat);
    t.allreduce(z, aiacc::comm::ReduceOp::kSum, 0)->wait();
  };
  // Split across K channels, equal shares (identical channels on one machine).
  auto split = [&](at::Tensor& buf) {
    std::vector<std::shared_ptr<aiacc::comm::Work>> works;
    const int64_t n = buf.numel(), part = (n + K - 1) / K;
    for (int c = 0; c < K; ++c) {
      const int64_t off = c * part, len = std::min(part, n - off);
      if (len > 0) works.push_back(t.allreduce(buf.narrow(0, off, len), aiacc::comm::ReduceOp::kSum, c));
    }
    for (auto& wk : works) wk->wait();
  };
  auto whole = [&](at::Tensor& buf) { t.allreduce(buf, aiacc::comm::ReduceOp::kSum, 0)->wait(); };
  auto timeIt = [&](const std::function<void(at::Tensor&)>& op, at::Tensor& buf, int iters) {
    op(buf);  // warm-up
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op(buf);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  const double bus = 2.0 * (w.world - 1) / w.world;
  if (w.rank == 0) {
    std::printf("allreduce, %d ranks, fp32; baseline: Gloo ring on one context; aiacc: split over %d channels\n",
                w.world, K);
    std::printf("%10s %12s %10s %10s %12s %10s %10s %7s\n", "bytes", "gloo us", "algbw GB/s",
                "busbw GB/s", "aiacc us", "algbw GB/s", "busbw GB/s", "ratio");
  }
  double sum_ratio = 0, big_ratio = 0;
  int rows = 0;
  for (int64_t bytes = 4096; bytes <= static_cast<int64_t>(FLAGS_max_mb * (1 << 20)); bytes *= 4) {
    at::Tensor buf = at::ones({bytes / 4}, at::kFloat);
    const int iters = static_cast<int>(std::clamp<int64_t>((64ll << 20) / bytes, 3, 50));
    const double tb = timeIt(whole, buf, iters);
    const double ta = timeIt(split, buf, iters);
    const double ratio = tb / ta;
    sum_ratio += ratio;
    big_ratio = ratio;
    ++rows;
    if (w.rank == 0) {
      const double gb = static_cast<double>(bytes) / 1e9;
      std::printf("%10lld %12.1f %10.3f %10.3f %12.1f %10.3f %10.3f %6.2fx\n", static_cast<long long>(bytes),
                  tb * 1e6, gb / tb, gb / tb * bus, ta * 1e6, gb / ta, gb / ta * bus, ratio);
    }
  }
  if (w.rank == 0) {
    std::printf("headline: aiacc %d-channel split %.2fx Gloo's single-context allreduce at the largest size "
                "(mean over sizes %.2fx)\n", K, big_ratio, sum_ratio / rows);
  }
  barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> rest = aiacc::app::parseCommandLine(
      argc, argv, "aiacc_bench data --data DIR --image-size S --workers T");
  const std::string mode = rest.size() >= 2 ? rest[1] : "";
  if (mode != "data" && mode != "allreduce") {
    std::cerr << "usage: aiacc_bench data --data DIR [--image-size S] [--workers T] [--images N]\n"
                 "       aiacc_bench allreduce [--nproc N] [--streams K] [--max-mb M] [--master host:port]\n";
    return 2;
  }
  try {
    if (mode == "allreduce") {
      if (auto w = aiacc::app::worldFromEnvironment()) return benchAllreduceWorker(*w);
      aiacc::app::LaunchSpec spec;
      spec.nproc = FLAGS_nproc;
      spec.master = FLAGS_master;
      return aiacc::app::launchWorkers(spec, std::vector<std::string>(argv, argv + argc));
    }
    return benchData();
  } catch (const aiacc::Error& e) {
    std::cerr << "aiacc_bench: error: " << e.what() << "\n";
    return 1;
  }
}
