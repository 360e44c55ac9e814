// aiacc_bench: benchmarks users can run on their own machine and data.
//
//   aiacc_bench data --data DIR --image-size S --workers T [--images N] [--batch-size B]
//     decode + random-resized-crop + flip + normalize throughput of the training input pipeline
//     over DIR/train (or DIR itself when it has class folders), in images/s total and per
//     worker thread. scripts/bench_data.sh runs it beside torchvision on the same files.
#include <gflags/gflags.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>

#include "app/cli.h"
#include "app/launcher.h"
#include "comm/data_parallel.h"
#include "comm/gloo_transport.h"
#include "comm/half.h"
#include "comm/hierarchical.h"
#include "comm/shm_transport.h"
#include "comm/store.h"
#include "common/error.h"
#include "data/decode.h"
#include "data/entropy_hook.h"
#include "data/image_folder.h"
#include "data/jpeg_index.h"
#include "data/loader.h"
#include "data/transforms.h"

DEFINE_string(data, "", "folder of JPEGs in ImageNet layout (DIR/train/<class>/* or DIR/<class>/*)");
DEFINE_int32(image_size, 224, "output image size");
DEFINE_int32(workers, 1, "decode threads");
DEFINE_int32(batch_size, 64, "images per batch");
DEFINE_int64(images, 0, "stop after about this many images; 0: one pass over the folder");
DEFINE_double(min_scale, 0.08, "random-resized-crop minimum area fraction");
DEFINE_int32(repeat, 1, "passes over the folder (page cache warm after the first)");
DEFINE_int32(jpeg_index_mb, 1024, "data: memory for JPEG entropy indexes (aiacc_train's flag of the same "
             "name), built along each file's first decode; later passes then decode only each crop's MCUs. "
             "The first pass and the later ones are reported apart. 0: off");
DEFINE_bool(breakdown, false, "data: time each stage of the training transform on one thread, per image: "
            "file read, Huffman decoding down to the crop's last row (the floor under the decode), the "
            "crop's whole decode, resize+mirror+normalize; then the crop's decode with a JPEG index, and "
            "the index's build");
DEFINE_bool(entropy_only, false, "data: only entropy-decode each whole file on one thread (no IDCT, "
            "colour, crop or resize): the floor under the full pipeline's time per image");
DEFINE_bool(libjpeg_huffman, false, "data: entropy-decode with libjpeg-turbo's own Huffman decoder instead of "
            "aiacc's (data/entropy_hook.h), for comparison; the pixels are the same");
DEFINE_string(resize, "torchvision", "data: how a crop becomes the output (aiacc_train's flag of the same name): "
              "torchvision (full-resolution decode, Pillow's antialiased bilinear: torchvision's pictures) | dct "
              "(DCT-scaled decode, Pillow's filter) | fast (DCT-scaled decode, OpenCV's bilinear/area)");
DEFINE_bool(bytes, false, "data: uint8 batches, as the GPU input path makes them (normalized on the "
            "device afterwards), instead of normalized floats");
DEFINE_int32(nproc, 2, "allreduce: ranks (processes) on this machine");
DEFINE_int32(streams, 2, "allreduce: channels the aiacc mode splits each buffer across");
DEFINE_double(max_mb, 256, "allreduce: largest buffer, MiB");
DEFINE_string(master, "127.0.0.1:29591", "allreduce: host:port of the rendezvous store");
DEFINE_int32(max_nproc, 16, "negotiation: largest number of local processes (2, 4, ... up to it)");
DEFINE_int32(steps, 50, "negotiation: timed steps per mode");
DEFINE_int32(nnodes, 1, "allreduce: nodes in the job (run aiacc_bench on each with its --node-rank)");
DEFINE_int32(node_rank, 0, "allreduce: this node's index");
DEFINE_string(allreduce_dtype, "both", "allreduce: aiacc modes to time: fp32 | fp16 | both");
DEFINE_string(hierarchical, "off", "allreduce: on adds two-level modes (reduce-scatter in the node, "
              "allreduce between nodes, allgather in the node)");
DEFINE_int32(ranks_per_node, 0, "allreduce: ranks per node for two-level modes; 0: the launcher's local size");
DEFINE_bool(shm, true, "allreduce: add shared-memory modes when every rank is on this host (and "
            "use shared memory inside the node in two-level modes)");
DEFINE_string(bind_host, "", "allreduce: address this rank's Gloo transport listens on; default: "
              "the local address that routes to the --master host");

namespace {

// One thread, the training transform's stages timed apart on the same crops (the loader's seeds).
#ifndef AIACC_WITH_GLOO
// The allreduce and negotiation benchmarks measure Gloo; builds without it say so.
int noGloo(const char* mode) {
  std::cerr << "aiacc_bench: error: '" << mode << "' measures GlooTransport, which this build does not have "
               "(built against a LibTorch carrying its own Gloo without headers; see README, Gloo)\n";
  return 2;
}
#endif

int benchDataBreakdown(const aiacc::data::ImageFolder& folder, aiacc::data::ResizeMode mode) {
  using Clock = std::chrono::steady_clock;
  namespace data = aiacc::data;
  const int S = FLAGS_image_size;
  const int D = data::dctScaling(mode) ? S : data::kFullResolution;  // the size the crop decodes for
  data::CropParams crop;
  crop.scale_min = FLAGS_min_scale;
  std::vector<float> out(static_cast<size_t>(3) * S * S);
  double read_us = 0, floor_us = 0, decode_us = 0, resize_us = 0;
  int64_t images = 0, crop_pixels = 0, skipped = 0;
  int64_t scales[9] = {0};
  const auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  // Warm the page cache (the timed reads come from memory) and build each file's JPEG index, timed.
  std::vector<std::unique_ptr<data::JpegIndex>> index(folder.samples.size());
  double index_us = 0;
  int64_t indexed = 0;
  for (size_t i = 0; i < folder.samples.size(); ++i) {
    try {
      const std::vector<uint8_t> bytes = data::readFile(folder.samples[i].path);
      const auto t0 = Clock::now();
      index[i] = data::JpegIndex::build(bytes.data(), bytes.size());
      index_us += us(t0, Clock::now());
      indexed += index[i] != nullptr;
    } catch (const data::DecodeError&) {
    }
  }
  double indexed_decode_us = 0, building_decode_us = 0;
  for (int r = 0; r < std::max(1, FLAGS_repeat); ++r) {
    for (size_t i = 0; i < folder.samples.size(); ++i) {
      try {
        const auto t0 = Clock::now();
        const std::vector<uint8_t> bytes = data::readFile(folder.samples[i].path);
        const auto t1 = Clock::now();
        data::Rng rng(data::mixSeed(1, static_cast<uint64_t>(r), i));
        const auto [w, h] = data::jpegDimensions(bytes.data(), bytes.size());
        const data::Box box = data::randomResizedCropBox(w, h, crop, rng);
        const auto t2 = Clock::now();
        data::entropyDecodeOnly(bytes.data(), bytes.size(), box.y + box.h);
        const auto t3 = Clock::now();
        const data::DecodedCrop dc =
            data::decodeCrop(bytes.data(), bytes.size(), [&](int, int) { return box; }, D, D, nullptr, false);
        const auto t4 = Clock::now();
        data::resizeNormalize(dc.crop, S, rng.uniform(0.0, 1.0) < 0.5, data::Layout::kNCHW, out.data(),
                              data::filterOf(mode));
        const auto t5 = Clock::now();
        if (index[i]) {  // the same crop from the index's extract
          data::decodeCrop(bytes.data(), bytes.size(), [&](int, int) { return box; }, D, D, index[i].get(), false);
          const auto t6 = Clock::now();
          indexed_decode_us += us(t5, t6);
          data::IndexBuild build;  // and as on a file's first decode: building its index along
          data::decodeCrop(bytes.data(), bytes.size(), [&](int, int) { return box; }, D, D, nullptr, false, &build);
          building_decode_us += us(t6, Clock::now());
        }
        read_us += us(t0, t1);
        floor_us += us(t2, t3);
        decode_us += us(t3, t4);
        resize_us += us(t4, t5);
        crop_pixels += static_cast<int64_t>(dc.crop.width) * dc.crop.height;
        ++scales[dc.scale_num];
        ++images;
      } catch (const data::DecodeError&) {
        ++skipped;  // not a baseline JPEG libjpeg-turbo reads (or unreadable): counted below
      }
    }
  }
  AIACC_CHECK_INPUT(images > 0, "aiacc_bench data --breakdown: no baseline JPEG in ", FLAGS_data);
  const double k = 1.0 / static_cast<double>(images);
  if (skipped > 0) {
    std::printf("aiacc data --breakdown: skipped %lld file reads that are not JPEGs libjpeg-turbo "
                "decodes (or could not be read)\n", static_cast<long long>(skipped));
  }
  std::printf("aiacc data --breakdown: %lld images at %d px, 1 thread, us per image:\n"
              "  read file                         %7.1f\n"
              "  Huffman down to the crop's bottom %7.1f   (the floor inside the decode; not added below)\n"
              "  decode the crop                   %7.1f   (%.0f decoded pixels on average; DCT scale "
              "1/8: %lld, 2/8: %lld, 4/8: %lld, 8/8: %lld)\n"
              "  resize + mirror + normalize       %7.1f\n"
              "  total                             %7.1f   (%.0f images/s)\n"
              "  with JPEG indexes (%lld of the files): decode the crop %.1f, total %.1f (%.0f images/s); "
              "building an index alone %.1f per file\n"
              "  a file's first decode, building its index along (deferred where more than a tenth of "
              "the rows lie below the crop): decode the crop %.1f, total %.1f (%.0f images/s)\n",
              static_cast<long long>(images), S, read_us * k, floor_us * k, decode_us * k,
              static_cast<double>(crop_pixels) * k, static_cast<long long>(scales[1]),
              static_cast<long long>(scales[2]), static_cast<long long>(scales[4]),
              static_cast<long long>(scales[8]), resize_us * k, (read_us + decode_us + resize_us) * k,
              images / ((read_us + decode_us + resize_us) * 1e-6), static_cast<long long>(indexed),
              indexed_decode_us * k, (read_us + indexed_decode_us + resize_us) * k,
              images / ((read_us + indexed_decode_us + resize_us) * 1e-6), index_us / std::max<int64_t>(1, indexed),
              building_decode_us * k, (read_us + building_decode_us + resize_us) * k,
              images / ((read_us + building_decode_us + resize_us) * 1e-6));
  return 0;
}

int benchData() {
  namespace fs = std::filesystem;
  AIACC_CHECK_INPUT(!FLAGS_data.empty(), "aiacc_bench data needs --data DIR");
  const std::string train = (fs::path(FLAGS_data) / "train").string();
  aiacc::data::ImageFolder folder =
      aiacc::data::scanImageFolder(fs::is_directory(train) ? train : FLAGS_data);
  const int64_t n = static_cast<int64_t>(folder.samples.size());
  aiacc::data::EntropyHook::enable(!FLAGS_libjpeg_huffman);
  const std::optional<aiacc::data::ResizeMode> mode = aiacc::data::resizeModeFromName(FLAGS_resize);
  AIACC_CHECK_INPUT(mode.has_value(), "--resize must be torchvision, dct or fast (got '", FLAGS_resize, "')");
  if (FLAGS_breakdown) return benchDataBreakdown(folder, *mode);
  if (FLAGS_entropy_only) {
    std::vector<std::vector<uint8_t>> files;
    for (const auto& s : folder.samples) files.push_back(aiacc::data::readFile(s.path));
    int64_t images = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < std::max(1, FLAGS_repeat); ++r) {
      for (const auto& f : files) {
        try {
          aiacc::data::entropyDecodeOnly(f.data(), f.size());
          ++images;
        } catch (const aiacc::data::DecodeError&) {
        }
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("aiacc data --entropy-only: %lld images of %lld files (in memory), 1 thread: %.1f "
                "images/s (%.0f us per image)\n", static_cast<long long>(images),
                static_cast<long long>(n), images / s, 1e6 * s / std::max<int64_t>(1, images));
    return 0;
  }
  aiacc::data::LoaderOptions o;
  o.train = true;
  o.workers = FLAGS_workers;
  o.prefetch = 2 * FLAGS_workers;
  o.bytes = FLAGS_bytes;
  o.resize = *mode;
  o.jpeg_index_bytes = static_cast<size_t>(std::max(0, FLAGS_jpeg_index_mb)) << 20;
  o.prefault_buffers = true;  // the first pass times decoding, not the batch buffers' first touch
  auto skips = std::make_shared<aiacc::data::SkipLog>();
  // Warm-up over a few batches (allocator), not timed; the page cache is warmed by reading every
  // file first, so the passes differ only in what the decoder does.
  for (const auto& s : folder.samples) {
    try {
      aiacc::data::readFile(s.path);
    } catch (const aiacc::data::DecodeError&) {
    }
  }
  {
    aiacc::data::LoaderOptions warm = o;
    warm.jpeg_index_bytes = 0;  // the timed loader's first pass starts with no index
    aiacc::data::ImageLoader loader(folder, warm, std::make_shared<aiacc::data::SkipLog>());
    loader.startEpoch({0, FLAGS_image_size, FLAGS_batch_size, FLAGS_min_scale});
    for (int i = 0; i < 2; ++i) loader.next();
  }
  aiacc::data::ImageLoader loader(std::move(folder), o, skips);
  // The clock starts when the first batch arrives, and that batch is not counted: its wait is the
  // loader's start (threads, first touch of the batch buffers), not decoding.
  int64_t images = 0, first_images = 0;
  double first_s = 0;
  const int64_t limit = FLAGS_images > 0 ? FLAGS_images : std::numeric_limits<int64_t>::max();
  auto t0 = std::chrono::steady_clock::now();
  bool started = false;
  for (int r = 0; r < FLAGS_repeat && images < limit; ++r) {
    loader.startEpoch({r + 1, FLAGS_image_size, FLAGS_batch_size, FLAGS_min_scale});
    while (auto b = loader.next()) {
      if (!started) {
        started = true;
        t0 = std::chrono::steady_clock::now();
        continue;
      }
      images += b->labels.numel();
      if (images >= limit) break;
    }
    if (r == 0) {
      first_images = images;
      first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ips = static_cast<double>(images) / s;
  std::printf("aiacc data: %lld images of %lld files at %d px, %d workers: %.1f images/s total, "
              "%.1f images/s per worker (%lld skipped)\n",
              static_cast<long long>(images), static_cast<long long>(n), FLAGS_image_size,
              FLAGS_workers, ips, ips / FLAGS_workers, static_cast<long long>(skips->count()));
  const double later = images > first_images ? static_cast<double>(images - first_images) / (s - first_s) : 0;
  const aiacc::data::EntropyHook::Counts hc = aiacc::data::EntropyHook::counts();
  std::printf("aiacc data: aiacc's Huffman decoder took %llu decodes%s (%llu handed back to libjpeg-turbo "
              "on invalid data; progressive, arithmetic-coded and restart-marker files stay with it)\n",
              static_cast<unsigned long long>(hc.installed), FLAGS_libjpeg_huffman ? " (off: --libjpeg-huffman)" : "",
              static_cast<unsigned long long>(hc.failed));
  if (const aiacc::data::JpegIndexCache* ix = loader.jpegIndex()) {
    std::printf("aiacc data: first pass (builds the JPEG indexes) %.1f images/s per worker; later passes "
                "(with them) %.1f images/s per worker; %zu files indexed (%.1f MB), %zu not indexable\n",
                static_cast<double>(first_images) / first_s / FLAGS_workers, later / FLAGS_workers,
                ix->indexedFiles(), static_cast<double>(ix->bytes()) / (1 << 20), ix->refusedFiles());
  } else if (later > 0) {
    std::printf("aiacc data: first pass %.1f images/s per worker; later passes %.1f images/s per worker\n",
                static_cast<double>(first_images) / first_s / FLAGS_workers, later / FLAGS_workers);
  }
  return 0;
}

#ifdef AIACC_WITH_GLOO
// One rank of the allreduce benchmark: for each size, Gloo's own ring allreduce on one context
// (the baseline), then each aiacc mode on the same buffer. Every figure is fp32 payload: an
// fp16 mode moves half the bytes but delivers the same fp32 result, and is credited for that.
int benchAllreduceWorker(const aiacc::comm::WorldInfo& w) {
  using aiacc::comm::ReduceOp;
  using aiacc::comm::Transport;
  using aiacc::comm::Work;
  const auto [host, port] = aiacc::app::parseHostPort(FLAGS_master);
  aiacc::comm::StoreOptions so;
  so.host = host;
  so.port = port;
  so.rank = w.rank;
  so.world = w.world;
  auto store = aiacc::comm::makeTcpStore(so);
  const int K = FLAGS_streams;
  aiacc::comm::GlooOptions go;
  go.rank = w.rank;
  go.world = w.world;
  go.channels = K;
  go.bind_host = FLAGS_bind_host.empty() ? aiacc::app::localAddressToward(host) : FLAGS_bind_host;
  auto flat = std::make_shared<aiacc::comm::GlooTransport>(store, go);
  const int per_node = FLAGS_ranks_per_node > 0 ? FLAGS_ranks_per_node : w.local_size;
  std::shared_ptr<Transport> two_level;
  if (FLAGS_hierarchical == "on") {
    go.name = "two-level";
    two_level = aiacc::comm::makeGlooHierarchical(store, go, per_node, 4096, FLAGS_shm);
  }
  std::shared_ptr<Transport> shm;
  if (FLAGS_shm && w.local_size == w.world) {
    aiacc::comm::ShmOptions so;
    so.rank = w.rank;
    so.world = w.world;
    so.channels = K;
    shm = std::make_shared<aiacc::comm::ShmTransport>(store, so);
  }
  auto barrier = [&] {
    at::Tensor z = at::zeros({1}, at::kFloat);
    flat->allreduce(z, ReduceOp::kSum, 0)->wait();
  };
  // Equal shares over the K channels (identical channels on one machine; DataParallel weighs
  // them by measured speed).
  auto split = [K](Transport& t, at::Tensor buf) {
    std::vector<std::shared_ptr<Work>> works;
    const int64_t n = buf.numel();
    for (int c = 0; c < K; ++c) {
      const aiacc::comm::Shard s = aiacc::comm::shardOf(n, K, c);
      if (s.count > 0) works.push_back(t.allreduce(buf.narrow(0, s.offset, s.count), ReduceOp::kSum, c));
    }
    for (auto& wk : works) wk->wait();
  };
  // fp16 on the wire: scaled cast, reduce, cast back and unscale, as DataParallel does.
  at::Tensor wire;
  auto fp16 = [&, W = w.world](Transport& t, at::Tensor& buf) {
    if (wire.numel() != buf.numel()) wire = at::empty({buf.numel()}, at::kHalf);
    auto* h = reinterpret_cast<uint16_t*>(wire.data_ptr<at::Half>());
    aiacc::comm::floatToHalf(buf.data_ptr<float>(), h, static_cast<size_t>(buf.numel()), 1.0f / W);
    split(t, wire);
    aiacc::comm::halfToFloat(h, buf.data_ptr<float>(), static_cast<size_t>(buf.numel()), 1.0f);
  };
  struct Mode {
    std::string name;
    std::function<void(at::Tensor&)> op;
  };
  std::vector<Mode> modes;
  const std::string ks = std::to_string(K);
  const bool want32 = FLAGS_allreduce_dtype != "fp16", want16 = FLAGS_allreduce_dtype != "fp32";
  if (want32) modes.push_back({"fp32 x" + ks, [&](at::Tensor& b) { split(*flat, b); }});
  if (want16) modes.push_back({"fp16 x" + ks, [&](at::Tensor& b) { fp16(*flat, b); }});
  if (shm && want32) modes.push_back({"shm fp32 x" + ks, [&](at::Tensor& b) { split(*shm, b); }});
  if (shm && want16) modes.push_back({"shm fp16 x" + ks, [&](at::Tensor& b) { fp16(*shm, b); }});
  if (two_level && want32) modes.push_back({"2lvl fp32 x" + ks, [&](at::Tensor& b) { split(*two_level, b); }});
  if (two_level && want16) modes.push_back({"2lvl fp16 x" + ks, [&](at::Tensor& b) { fp16(*two_level, b); }});
  auto timeIt = [&](const std::function<void(at::Tensor&)>& op, at::Tensor& buf, int iters) {
    op(buf);  // warm-up
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op(buf);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  const double bus = 2.0 * (w.world - 1) / w.world;
  if (w.rank == 0) {
    std::printf("allreduce, %d ranks%s; busbw = fp32 payload bytes x 2(n-1)/n / time, GB/s; baseline: "
                "Gloo ring allreduce on one context\n", w.world,
                two_level ? (", two-level with " + std::to_string(per_node) + " ranks per node").c_str() : "");
    std::printf("%10s %10s %9s", "bytes", "gloo us", "busbw");
    for (const auto& m : modes) std::printf(" | %-13s %9s %6s", m.name.c_str(), "busbw", "ratio");
    std::printf("\n");
  }
  std::vector<double> last_ratio(modes.size(), 0), last_busbw(modes.size(), 0);
  for (int64_t bytes = 4096; bytes <= static_cast<int64_t>(FLAGS_max_mb * (1 << 20)); bytes *= 4) {
    at::Tensor buf = at::ones({bytes / 4}, at::kFloat);
    const int iters = static_cast<int>(std::clamp<int64_t>((64ll << 20) / bytes, 3, 50));
    const double tb = timeIt([&](at::Tensor& b) { flat->allreduce(b, ReduceOp::kSum, 0)->wait(); }, buf, iters);
    const double gb = static_cast<double>(bytes) / 1e9;
    if (w.rank == 0) std::printf("%10lld %10.1f %9.3f", static_cast<long long>(bytes), tb * 1e6, gb / tb * bus);
    for (size_t m = 0; m < modes.size(); ++m) {
      const double ta = timeIt(modes[m].op, buf, iters);
      last_ratio[m] = tb / ta;
      last_busbw[m] = gb / ta * bus;
      if (w.rank == 0) std::printf(" | %-13s %9.3f %5.2fx", "", gb / ta * bus, tb / ta);
    }
    if (w.rank == 0) std::printf("\n");
  }
  if (w.rank == 0) {
    std::printf("headline at the largest size, vs Gloo's single context:");
    for (size_t m = 0; m < modes.size(); ++m) {
      std::printf(" %s %.2fx (%.2f GB/s)%s", modes[m].name.c_str(), last_ratio[m], last_busbw[m],
                  m + 1 < modes.size() ? ";" : "\n");
    }
  }
  barrier();
  return 0;
}

// One rank of the negotiation benchmark: a model too small to compute or transfer anything of
// note (30 tiny layers, one never used, so readiness must be agreed), trained for --steps steps
// three ways. The per-step time above the first is what agreeing costs.
int benchNegotiationWorker(const aiacc::comm::WorldInfo& w) {
  using namespace aiacc::comm;
  const auto [host, port] = aiacc::app::parseHostPort(FLAGS_master);
  StoreOptions so;
  so.host = host;
  so.port = port;
  so.rank = w.rank;
  so.world = w.world;
  auto store = makeTcpStore(so);
  GlooOptions go;
  go.rank = w.rank;
  go.world = w.world;
  go.bind_host = FLAGS_bind_host.empty() ? aiacc::app::localAddressToward(host) : FLAGS_bind_host;
  auto transport = std::make_shared<GlooTransport>(store, go);
  at::set_num_threads(1);
  auto run = [&](bool detect_unused, Negotiation negotiation) {
    torch::nn::Sequential net;
    for (int i = 0; i < 30; ++i) net->push_back(torch::nn::Linear(8, 8));
    auto unused = torch::nn::Linear(8, 8);
    net->register_module("unused", unused);
    DataParallelOptions o;
    o.detect_unused = detect_unused;
    o.negotiation = negotiation;
    DataParallel dp(net.ptr(), transport, w, o);
    const at::Tensor x = at::ones({2, 8});
    double total = 0;
    for (int s = 0; s < FLAGS_steps + 3; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      net->forward(x).sum().backward();
      dp.finishBackward();
      if (s >= 3) total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    at::Tensor t = at::tensor({total / FLAGS_steps}, at::kDouble);
    transport->allreduce(t, ReduceOp::kSum, 0)->wait();  // mean over ranks
    return t.item<double>() / w.world * 1e3;
  };
  const double base = run(false, Negotiation::kDecentralized);
  const double dec = run(true, Negotiation::kDecentralized);
  const double cen = run(true, Negotiation::kCentral);
  if (w.rank == 0) {
    std::printf("%6d %14.2f %16.2f %12.2f %18.2f %14.2f\n", w.world, base, dec, cen, dec - base, cen - base);
    std::fflush(stdout);
  }
  return 0;
}
#else
int benchAllreduceWorker(const aiacc::comm::WorldInfo&) { return noGloo("allreduce"); }
int benchNegotiationWorker(const aiacc::comm::WorldInfo&) { return noGloo("negotiation"); }
#endif

}  // namespace

const char kUsage[] =
    "usage: aiacc_bench data --data DIR [--image-size S] [--workers T] [--images N] [--bytes | --entropy-only]\n"
    "       aiacc_bench allreduce [--nproc N] [--streams K] [--allreduce-dtype fp32|fp16|both]\n"
    "                 [--hierarchical on --ranks-per-node R] [--max-mb M] [--master host:port]\n"
    "       aiacc_bench negotiation [--max-nproc 16] [--steps 50]\n";

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "-help") {
      std::cout << kUsage << "\nBenchmarks printed as ratios against a baseline measured in the same "
                   "run. Flags (hyphens or underscores):\n";
      aiacc::app::printFlagsFrom("app/bench_main.cc", std::cout);
      return 0;
    }
  }
  const std::vector<std::string> rest = aiacc::app::parseCommandLine(
      argc, argv, "aiacc_bench data --data DIR --image-size S --workers T");
  const std::string mode = rest.size() >= 2 ? rest[1] : "";
  if (mode != "data" && mode != "allreduce" && mode != "negotiation") {
    std::cerr << kUsage << "(see --help)\n";
    return 2;
  }
#ifndef AIACC_WITH_GLOO
  if (mode != "data") return noGloo(mode.c_str());
#endif
  try {
    if (mode == "negotiation") {
      if (auto w = aiacc::app::worldFromEnvironment()) return benchNegotiationWorker(*w);
      std::printf("negotiation overhead, ms per step (mean over ranks, %d steps, tiny model with one unused "
                  "layer so readiness must be agreed)\n%6s %14s %16s %12s %18s %14s\n", FLAGS_steps, "ranks",
                  "no agreement", "decentralized", "central", "decentralized +", "central +");
      std::fflush(stdout);
      for (int n = 2; n <= FLAGS_max_nproc; n *= 2) {
        aiacc::app::LaunchSpec spec;
        spec.nproc = n;
        spec.master = FLAGS_master;
        const int rc = aiacc::app::launchWorkers(spec, std::vector<std::string>(argv, argv + argc));
        if (rc != 0) return rc;
      }
      return 0;
    }
    if (mode == "allreduce") {
      if (auto w = aiacc::app::worldFromEnvironment()) return benchAllreduceWorker(*w);
      aiacc::app::LaunchSpec spec;
      spec.nproc = FLAGS_nproc;
      spec.master = FLAGS_master;
      spec.nnodes = FLAGS_nnodes;
      spec.node_rank = FLAGS_node_rank;
      return aiacc::app::launchWorkers(spec, std::vector<std::string>(argv, argv + argc));
    }
    return benchData();
  } catch (const aiacc::Error& e) {
    std::cerr << "aiacc_bench: error: " << e.what() << "\n";
    return 1;
  }
}
