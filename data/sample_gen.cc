#include "data/sample_gen.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <thread>
#include <vector>

#include "aiacc/common/error.h"
#include "data/decode.h"
#include "data/transforms.h"

namespace fs = std::filesystem;

namespace aiacc::data {
namespace {

constexpr int kShapes = 5;
const char* kShapeNames[kShapes] = {"disc", "square", "triangle", "ring", "cross"};

cv::Scalar hueToRgb(double hue_deg, double sat, double val) {
  const double c = val * sat;
  const double hp = std::fmod(hue_deg / 60.0 + 6.0, 6.0);
  const double x = c * (1 - std::fabs(std::fmod(hp, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  if (hp < 1) {
    r = c;
    g = x;
  } else if (hp < 2) {
    r = x;
    g = c;
  } else if (hp < 3) {
    g = c;
    b = x;
  } else if (hp < 4) {
    g = x;
    b = c;
  } else if (hp < 5) {
    r = x;
    b = c;
  } else {
    r = c;
    b = x;
  }
  const double m = val - c;
  return cv::Scalar((r + m) * 255, (g + m) * 255, (b + m) * 255);
}

std::vector<cv::Point> regularPolygon(cv::Point2d center, double radius, int sides, double angle) {
  std::vector<cv::Point> pts;
  for (int i = 0; i < sides; ++i) {
    const double a = angle + 2 * M_PI * i / sides;
    pts.emplace_back(static_cast<int>(std::lround(center.x + radius * std::cos(a))),
                     static_cast<int>(std::lround(center.y + radius * std::sin(a))));
  }
  return pts;
}

RgbImage drawSample(int label, Rng& rng, const SampleSpec& spec) {
  const int hues = (spec.classes + spec.shapes - 1) / spec.shapes;
  const int shape = label % spec.shapes;
  const int hue_index = label / spec.shapes;
  const int w = static_cast<int>(rng.randint(spec.min_side, spec.max_side + 1));
  const int h = static_cast<int>(rng.randint(spec.min_side, spec.max_side + 1));
  cv::Mat img(h, w, CV_8UC3);
  // Background: a random-brightness vertical gradient in a random low-saturation tint.
  const double bg_hue = rng.uniform(0, 360);
  const double v0 = rng.uniform(0.15, 0.85), v1 = std::clamp(v0 + rng.uniform(-0.3, 0.3), 0.05, 0.95);
  for (int y = 0; y < h; ++y) {
    const double t = static_cast<double>(y) / std::max(1, h - 1);
    const cv::Scalar c = hueToRgb(bg_hue, 0.2, v0 + (v1 - v0) * t);
    img.row(y).setTo(c);
  }
  // Distractor strokes in random grays.
  const int strokes = static_cast<int>(rng.randint(0, 3));
  for (int s = 0; s < strokes; ++s) {
    const double g = rng.uniform(0, 255);
    cv::line(img, cv::Point(static_cast<int>(rng.randint(0, w)), static_cast<int>(rng.randint(0, h))),
             cv::Point(static_cast<int>(rng.randint(0, w)), static_cast<int>(rng.randint(0, h))), cv::Scalar(g, g, g),
             static_cast<int>(rng.randint(1, 3)), cv::LINE_AA);
  }
  // The class object.
  const double hue = 360.0 * hue_index / hues + rng.uniform(-12, 12);
  const cv::Scalar color = hueToRgb(hue, rng.uniform(0.65, 1.0), rng.uniform(0.7, 1.0));
  const double side = std::min(w, h);
  const double r = side * rng.uniform(0.24, 0.36);
  const cv::Point2d c(rng.uniform(r, w - r), rng.uniform(r, h - r));
  const double angle = rng.uniform(0, 2 * M_PI);
  const cv::Point ci(static_cast<int>(std::lround(c.x)), static_cast<int>(std::lround(c.y)));
  switch (shape) {
    case 0: cv::circle(img, ci, static_cast<int>(r), color, cv::FILLED, cv::LINE_AA); break;
    case 1: cv::fillConvexPoly(img, regularPolygon(c, r, 4, angle), color, cv::LINE_AA); break;
    case 2: cv::fillConvexPoly(img, regularPolygon(c, r, 3, angle), color, cv::LINE_AA); break;
    case 3:
      cv::circle(img, ci, static_cast<int>(r * 0.8), color, std::max(2, static_cast<int>(r * 0.35)), cv::LINE_AA);
      break;
    default: {
      const int t = std::max(2, static_cast<int>(r * 0.4));
      const cv::Point dx(static_cast<int>(r * std::cos(angle)), static_cast<int>(r * std::sin(angle)));
      const cv::Point dy(-dx.y, dx.x);
      cv::line(img, ci - dx, ci + dx, color, t, cv::LINE_AA);
      cv::line(img, ci - dy, ci + dy, color, t, cv::LINE_AA);
    }
  }
  // Per-pixel noise.
  const double sigma = rng.uniform(3, 10);
  for (int y = 0; y < h; ++y) {
    uint8_t* p = img.ptr<uint8_t>(y);
    for (int x = 0; x < 3 * w; ++x) {
      const double n = (rng.uniform(-1, 1) + rng.uniform(-1, 1) + rng.uniform(-1, 1)) * sigma;
      p[x] = static_cast<uint8_t>(std::clamp(p[x] + n, 0.0, 255.0));
    }
  }
  RgbImage out;
  out.width = w;
  out.height = h;
  out.pixels.assign(img.data, img.data + static_cast<size_t>(w) * h * 3);
  return out;
}

void writeBytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) AIACC_THROW(IoError, "cannot write '", path.string(), "' (disk full or read-only?)");
}

}  // namespace

std::string sampleClassName(int k, int shapes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "c%02d_%s_h%d", k, kShapeNames[k % shapes], k / shapes);
  return buf;
}

void makeSampleDataset(const std::string& dir, const SampleSpec& spec) {
  AIACC_CHECK_INPUT(spec.classes >= 2 && spec.classes <= 100, "sample classes must be 2..100");
  AIACC_CHECK_INPUT(spec.shapes >= 1 && spec.shapes <= kShapes, "sample shapes must be 1..5");
  AIACC_CHECK_INPUT(spec.min_side >= 16 && spec.max_side >= spec.min_side, "bad sample sizes");
  std::error_code ec;
  AIACC_CHECK_INPUT(!fs::exists(dir, ec), "'", dir, "' already exists; remove it or pick another folder");
  const fs::path final_dir = fs::absolute(dir);
  const fs::path tmp = final_dir.parent_path() / (final_dir.filename().string() + ".partial");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  struct Job {
    fs::path path;
    int label;
    uint64_t seed;
  };
  std::vector<Job> jobs;
  const char* splits[2] = {"train", "val"};
  for (int s = 0; s < 2; ++s) {
    const int per_class = s == 0 ? spec.train_per_class : spec.val_per_class;
    for (int k = 0; k < spec.classes; ++k) {
      const fs::path cdir = tmp / splits[s] / sampleClassName(k, spec.shapes);
      fs::create_directories(cdir);
      for (int i = 0; i < per_class; ++i) {
        char name[64];
        std::snprintf(name, sizeof(name), "%s_%05d.JPEG", splits[s], k * per_class + i);
        jobs.push_back({cdir / name, k,
                        mixSeed(spec.seed, static_cast<uint64_t>(s), static_cast<uint64_t>(k * 100000 + i))});
      }
    }
  }
  const unsigned nthreads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(nthreads);
  for (unsigned t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (size_t j = t; j < jobs.size(); j += nthreads) {
          Rng rng(jobs[j].seed);
          const RgbImage img = drawSample(jobs[j].label, rng, spec);
          writeBytes(jobs[j].path, encodeJpeg(img, spec.quality));
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  fs::rename(tmp, final_dir);
}

}  // namespace aiacc::data
