// aiacc_bench data: decode + random-resized-crop + flip + normalize throughput of the training
// input pipeline over DIR/train (or DIR itself when it has class folders), in images/s total and
// per worker thread; --breakdown and --entropy-only time its stages on one thread. Input it
// cannot time (fewer images than a batch, one batch in all, nothing that decodes) is an
// InputError, not a rate of 0 images/s.
// scripts/bench_data.sh runs it beside torchvision on the same files.
#include "app/bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "aiacc/common/error.h"
#include "data/decode.h"
#include "data/entropy_hook.h"
#include "data/image_folder.h"
#include "data/jpeg_index.h"
#include "data/loader.h"
#include "data/transforms.h"

namespace aiacc::app {
namespace {

// One thread, the training transform's stages timed apart on the same crops (the loader's seeds).
int benchDataBreakdown(const DataBenchOptions& opts, const data::ImageFolder& folder, data::ResizeMode mode) {
  using Clock = std::chrono::steady_clock;
  const int S = opts.image_size;
  const int D = data::dctScaling(mode) ? S : data::kFullResolution;  // the size the crop decodes for
  data::CropParams crop;
  crop.scale_min = opts.min_scale;
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
  for (int r = 0; r < std::max(1, opts.repeat); ++r) {
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
        const data::DecodedCrop dc = data::decodeCrop(
            bytes.data(), bytes.size(), [&](int, int) { return box; }, D, D, nullptr, false);
        const auto t4 = Clock::now();
        data::resizeNormalize(dc.crop, S, rng.uniform(0.0, 1.0) < 0.5, data::Layout::kNCHW, out.data(),
                              data::filterOf(mode));
        const auto t5 = Clock::now();
        if (index[i]) {  // the same crop from the index's extract
          data::decodeCrop(
              bytes.data(), bytes.size(), [&](int, int) { return box; }, D, D, index[i].get(), false);
          const auto t6 = Clock::now();
          indexed_decode_us += us(t5, t6);
          data::IndexBuild build;  // and as on a file's first decode: building its index along
          data::decodeCrop(
              bytes.data(), bytes.size(), [&](int, int) { return box; }, D, D, nullptr, false, &build);
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
  AIACC_CHECK_INPUT(images > 0, "aiacc_bench data --breakdown: no baseline JPEG in ", opts.data);
  const double k = 1.0 / static_cast<double>(images);
  if (skipped > 0) {
    std::printf("aiacc data --breakdown: skipped %lld file reads that are not JPEGs libjpeg-turbo "
                "decodes (or could not be read)\n",
                static_cast<long long>(skipped));
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
              static_cast<long long>(scales[2]), static_cast<long long>(scales[4]), static_cast<long long>(scales[8]),
              resize_us * k, (read_us + decode_us + resize_us) * k, images / ((read_us + decode_us + resize_us) * 1e-6),
              static_cast<long long>(indexed), indexed_decode_us * k, (read_us + indexed_decode_us + resize_us) * k,
              images / ((read_us + indexed_decode_us + resize_us) * 1e-6), index_us / std::max<int64_t>(1, indexed),
              building_decode_us * k, (read_us + building_decode_us + resize_us) * k,
              images / ((read_us + building_decode_us + resize_us) * 1e-6));
  return 0;
}

}  // namespace

int benchData(const DataBenchOptions& opts) {
  namespace fs = std::filesystem;
  AIACC_CHECK_INPUT(!opts.data.empty(), "aiacc_bench data needs --data DIR");
  const std::string train = (fs::path(opts.data) / "train").string();
  const std::string dir = fs::is_directory(train) ? train : opts.data;
  data::ImageFolder folder = data::scanImageFolder(dir);
  const int64_t n = static_cast<int64_t>(folder.samples.size());
  data::EntropyHook::enable(!opts.libjpeg_huffman);
  const std::optional<data::ResizeMode> mode = data::resizeModeFromName(opts.resize);
  AIACC_CHECK_INPUT(mode.has_value(), "--resize must be torchvision, dct or fast (got '", opts.resize, "')");
  if (opts.breakdown) return benchDataBreakdown(opts, folder, *mode);
  if (opts.entropy_only) {
    std::vector<std::vector<uint8_t>> files;
    for (const auto& s : folder.samples) files.push_back(data::readFile(s.path));
    int64_t images = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < std::max(1, opts.repeat); ++r) {
      for (const auto& f : files) {
        try {
          data::entropyDecodeOnly(f.data(), f.size());
          ++images;
        } catch (const data::DecodeError&) {
        }
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    AIACC_CHECK_INPUT(images > 0, "none of the ", n, " files in ", dir,
                      " entropy-decodes (no baseline or progressive JPEG): nothing to measure");
    std::printf("aiacc data --entropy-only: %lld images of %lld files (in memory), 1 thread: %.1f "
                "images/s (%.0f us per image)\n",
                static_cast<long long>(images), static_cast<long long>(n), images / s,
                1e6 * s / std::max<int64_t>(1, images));
    return 0;
  }
  // The clock starts when the first batch arrives, and that batch is not timed; a pass delivers
  // only full batches. So fewer than two batches in all measure nothing.
  AIACC_CHECK_INPUT(opts.batch_size >= 1 && opts.repeat >= 1, "--batch-size and --repeat must be at least 1 (got ",
                    opts.batch_size, " and ", opts.repeat, ")");
  AIACC_CHECK_INPUT(n >= opts.batch_size, dir, " holds ", n, " images, fewer than one batch (--batch-size ",
                    opts.batch_size, "): nothing to measure; give a smaller --batch-size or more images");
  AIACC_CHECK_INPUT(n / opts.batch_size * opts.repeat >= 2, n, " images in ", dir,
                    " make 1 batch in all (--batch-size ", opts.batch_size, ", --repeat ", opts.repeat,
                    "), and the first batch only starts the clock: nothing to measure; give a smaller --batch-size "
                    "or --repeat 2");
  data::LoaderOptions o;
  o.train = true;
  o.workers = opts.workers;
  o.prefetch = 2 * opts.workers;
  o.bytes = opts.bytes;
  o.resize = *mode;
  o.jpeg_index_bytes = static_cast<size_t>(std::max(0, opts.jpeg_index_mb)) << 20;
  o.prefault_buffers = true;  // the first pass times decoding, not the batch buffers' first touch
  auto skips = std::make_shared<data::SkipLog>();
  // Warm-up over a few batches (allocator), not timed; the page cache is warmed by reading every
  // file first, so the passes differ only in what the decoder does.
  for (const auto& s : folder.samples) {
    try {
      data::readFile(s.path);
    } catch (const data::DecodeError&) {
    }
  }
  {
    data::LoaderOptions warm = o;
    warm.jpeg_index_bytes = 0;  // the timed loader's first pass starts with no index
    // The timed loader's skip log: one warning per undecodable file, not two.
    data::ImageLoader loader(folder, warm, skips);
    loader.startEpoch({0, opts.image_size, opts.batch_size, opts.min_scale});
    for (int i = 0; i < 2; ++i) loader.next();
  }
  data::ImageLoader loader(std::move(folder), o, skips);
  // The clock starts when the first batch arrives, and that batch is not counted: its wait is the
  // loader's start (threads, first touch of the batch buffers), not decoding.
  int64_t images = 0, first_images = 0;
  double first_s = 0;
  const int64_t limit = opts.images > 0 ? opts.images : std::numeric_limits<int64_t>::max();
  auto t0 = std::chrono::steady_clock::now();
  bool started = false;
  for (int r = 0; r < opts.repeat && images < limit; ++r) {
    loader.startEpoch({r + 1, opts.image_size, opts.batch_size, opts.min_scale});
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
  AIACC_CHECK_INPUT(images > 0,
                    skips->count() >= n ? strCat("none of the ", n, " files in ", dir, " decoded")
                                        : strCat("the batches after the first decoded no image (", skips->count(),
                                                 " of the ", n, " files in ", dir, " skipped)"),
                    ": nothing to measure (the warnings above say why each file was skipped)");
  const double ips = static_cast<double>(images) / s;
  std::printf("aiacc data: %lld images of %lld files at %d px, %d workers: %.1f images/s total, "
              "%.1f images/s per worker (%lld skipped)\n",
              static_cast<long long>(images), static_cast<long long>(n), opts.image_size, opts.workers, ips,
              ips / opts.workers, static_cast<long long>(skips->count()));
  const double later = images > first_images ? static_cast<double>(images - first_images) / (s - first_s) : 0;
  const data::EntropyHook::Counts hc = data::EntropyHook::counts();
  std::printf("aiacc data: aiacc's Huffman decoder took %llu decodes%s (%llu handed back to libjpeg-turbo "
              "on invalid data; progressive, arithmetic-coded and restart-marker files stay with it)\n",
              static_cast<unsigned long long>(hc.installed), opts.libjpeg_huffman ? " (off: --libjpeg-huffman)" : "",
              static_cast<unsigned long long>(hc.failed));
  if (const data::JpegIndexCache* ix = loader.jpegIndex()) {
    std::printf("aiacc data: first pass (builds the JPEG indexes) %.1f images/s per worker; later passes "
                "(with them) %.1f images/s per worker; %zu files indexed (%.1f MB), %zu not indexable\n",
                static_cast<double>(first_images) / first_s / opts.workers, later / opts.workers, ix->indexedFiles(),
                static_cast<double>(ix->bytes()) / (1 << 20), ix->refusedFiles());
  } else if (later > 0) {
    std::printf("aiacc data: first pass %.1f images/s per worker; later passes %.1f images/s per worker\n",
                static_cast<double>(first_images) / first_s / opts.workers, later / opts.workers);
  }
  return 0;
}

}  // namespace aiacc::app
