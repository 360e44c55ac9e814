#include "app/report.h"

#include <jconfig.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <opencv2/core/version.hpp>
#include <sstream>
#include <thread>

#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "aiacc/common/json.h"

namespace aiacc::app {

std::string formatDuration(double s) {
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    const int t = static_cast<int>(s);
    std::snprintf(buf, sizeof(buf), "%dh%02dm%02ds", t / 3600, (t / 60) % 60, t % 60);
  }
  return buf;
}

namespace {
// "N x NAME" from nvidia-smi when LibTorch sees CUDA devices; "none" otherwise.
std::string gpuName() {
  const int64_t n = static_cast<int64_t>(torch::cuda::device_count());
  if (n == 0) return "none";
  std::string name;
  if (FILE* p = ::popen("nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null", "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof(buf), p)) name = buf;
    ::pclose(p);
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return std::to_string(n) + " x " + (name.empty() ? "CUDA device" : name);
}
}  // namespace

MachineInfo machineInfo() {
  MachineInfo m;
  m.cores = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  m.gpu = gpuName();
  m.torch_version = TORCH_VERSION;
  m.opencv_version = CV_VERSION;
#ifdef LIBJPEG_TURBO_VERSION
#define AIACC_STR2(x) #x
#define AIACC_STR(x) AIACC_STR2(x)
  m.jpeg_turbo_version = AIACC_STR(LIBJPEG_TURBO_VERSION);
#undef AIACC_STR
#undef AIACC_STR2
#endif
  m.compiler = "g++ " __VERSION__;
  return m;
}

namespace {
Json machineJson(const MachineInfo& m) {
  return Json{{"cores", m.cores},
              {"cpu", m.cpu},
              {"gpu", m.gpu},
              {"libtorch", m.torch_version},
              {"opencv", m.opencv_version},
              {"libjpeg_turbo", m.jpeg_turbo_version},
              {"compiler", m.compiler}};
}

Json evalPointValue(const EvalPoint& e, const std::string& type) {
  Json o;
  if (!type.empty()) o["type"] = type;
  o["step"] = e.step;
  o["epoch"] = e.epoch;
  o["seconds"] = e.seconds;
  o["top1"] = e.top1;
  o["top5"] = e.top5;
  o["loss"] = e.loss;
  o["images"] = e.images;
  return o;
}

std::string isoTimestamp() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
}  // namespace

std::string evalPointJson(const EvalPoint& e, const std::string& type) { return toJsonLine(evalPointValue(e, type)); }

std::string describe(const MembershipChange& c) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << "generation " << c.generation << ": " << c.world_before << " -> "
    << c.world_after << " ranks at step " << c.step << " (" << (c.cause.empty() ? "a process asked to join" : c.cause)
    << "); detected in " << c.detect_s << " s, regrouped in " << c.regroup_s << " s, state restored in " << c.restore_s
    << " s (";
  if (c.bytes >= (1 << 20)) {
    o << static_cast<double>(c.bytes) / (1 << 20) << " MiB";
  } else {
    o << (c.bytes + 1023) / 1024 << " KiB";
  }
  o << " to each rank), " << c.steps_lost << " step(s) lost";
  if (c.first_step_s >= 0) o << "; first step done " << c.first_step_s << " s after the change began";
  return o.str();
}

std::string membershipJson(const MembershipChange& c) {
  Json j;
  j["event"] = "membership";
  j["generation"] = c.generation;
  j["world_before"] = c.world_before;
  j["world_after"] = c.world_after;
  j["step"] = c.step;
  j["cause"] = c.cause.empty() ? "a process asked to join" : c.cause;
  j["detect_s"] = c.detect_s;
  j["regroup_s"] = c.regroup_s;
  j["restore_s"] = c.restore_s;
  j["bytes"] = c.bytes;
  j["steps_lost"] = c.steps_lost;
  j["first_step_s"] = c.first_step_s;
  return toJsonLine(j);
}

std::string reportJson(const Report& r, const Config& c) {
  Json evals = Json::array();
  for (const EvalPoint& e : r.evals) evals.push_back(evalPointValue(e, ""));
  Json j;
  j["arch"] = r.arch;
  j["data"] = r.data;
  j["world_size"] = r.world;
  j["target_top1"] = r.target_top1;
  j["target_top5"] = r.target_top5;
  j["target_reached"] = r.target_reached;
  j["time_to_target_s"] = r.target_reached ? Json(r.time_to_target_s) : Json(nullptr);
  j["total_s"] = r.total_s;
  j["train_s"] = r.train_s;
  j["epochs"] = r.epochs;
  j["steps"] = r.steps;
  j["images_seen"] = r.images_seen;
  j["mean_images_per_s"] = r.mean_images_per_s;
  j["steady_images_per_s"] = r.steady_images_per_s;
  j["final_top1"] = r.final_top1;
  j["final_top5"] = r.final_top5;
  j["skipped_files"] = r.skipped_files;
  j["ignored_files"] = r.ignored_files;
  j["checkpoint_failures"] = r.checkpoint_failures;
  j["checkpoint_skips"] = r.checkpoint_skips;
  if (!r.membership.empty()) {
    Json changes = Json::array();
    for (const MembershipChange& c : r.membership) changes.push_back(Json::parse(membershipJson(c)));
    j["membership"] = changes;
  }
  if (r.vote_ab.block > 0) {
    const Report::VoteAb& v = r.vote_ab;
    const double with = v.steps_with > 0 ? v.s_with / static_cast<double>(v.steps_with) : 0;
    const double without = v.steps_without > 0 ? v.s_without / static_cast<double>(v.steps_without) : 0;
    j["step_vote_ab"] = Json{{"block", v.block},
                             {"steps_with", v.steps_with},
                             {"steps_without", v.steps_without},
                             {"s_per_step_with", with},
                             {"s_per_step_without", without},
                             {"with_over_without", without > 0 ? with / without : 0.0}};
  }
  j["exposed_comm_s"] = r.exposed_comm_s;
  j["comm"] = r.comm;
  j["device"] = r.device;
  j["precision"] = r.precision;
  j["loss_scale"] = r.loss_scale;
  j["overflow_skips"] = r.overflow_skips;
  j["peak_rss_mb"] = r.peak_rss_mb;
  j["max_peak_rss_mb_over_ranks"] = r.max_peak_rss_mb;
  j["summed_ranks"] = r.summed_ranks;
  j["images_per_s_per_process"] = r.mean_images_per_s / std::max(1, r.world);
  j["recipe"] = c.recipe;
  j["evals"] = std::move(evals);
  j["machine"] = machineJson(r.machine);
  return toJsonLine(j);
}

void printReport(const Report& r, std::ostream& os) {
  os << "==== aiacc report ====\n"
     << "model            " << r.arch << " on " << r.data << " (" << r.world << " process" << (r.world > 1 ? "es" : "")
     << ")\n";
  os << "device           " << r.device << ", " << r.precision;
  if (r.loss_scale > 0) {
    os << " (loss scale " << r.loss_scale << ", " << r.overflow_skips << " overflow steps skipped)";
  } else if (r.overflow_skips > 0) {
    os << " (" << r.overflow_skips << " steps skipped for a non-finite reduced gradient)";
  }
  os << "\n";
  if (!r.comm.empty()) os << "communication    " << r.comm << "\n";
  if (r.target_top1 > 0 || r.target_top5 > 0) {
    os << "target           ";
    if (r.target_top1 > 0) os << "top-1 " << r.target_top1 << "% ";
    if (r.target_top5 > 0) os << "top-5 " << r.target_top5 << "%";
    os << "\n";
    if (r.target_reached) {
      os << "time to target   " << std::fixed << std::setprecision(1) << r.time_to_target_s << " s ("
         << formatDuration(r.time_to_target_s) << ", init included)\n";
    } else {
      os << "time to target   NOT REACHED\n";
    }
  }
  os << std::fixed << std::setprecision(2) << "final accuracy   top-1 " << r.final_top1 << "%  top-5 " << r.final_top5
     << "%\n"
     << "trained          " << r.epochs << " epochs, " << r.steps << " steps, " << r.images_seen << " images\n"
     << std::setprecision(1) << "throughput       " << r.mean_images_per_s << " images/s (training; "
     << r.steady_images_per_s << " after warm-up and tuning)";
  if (r.world > 1) {
    os << ", " << r.mean_images_per_s / r.world << " per process; exposed communication " << r.exposed_comm_s
       << " s on rank 0 (" << 100.0 * r.exposed_comm_s / std::max(1e-9, r.train_s) << "% of training time)";
  }
  os << "\n"
     << "peak memory      " << r.peak_rss_mb << " MiB resident (rank 0)";
  if (r.world > 1) os << ", at most " << r.max_peak_rss_mb << " MiB on any rank";
  os << "\n"
     << "wall time        " << r.total_s << " s (" << r.train_s << " s in training steps)\n"
     << "skipped files    " << r.skipped_files << " undecodable, " << r.ignored_files
     << " without an image extension\n";
  if (r.checkpoint_failures) os << "checkpoint fails " << r.checkpoint_failures << "\n";
  if (r.checkpoint_skips) os << "checkpoints skipped (previous write in flight) " << r.checkpoint_skips << "\n";
  for (const MembershipChange& c : r.membership) os << "membership       " << describe(c) << "\n";
  os << "machine          " << r.machine.cores << " cores (" << r.machine.cpu << "), GPU " << r.machine.gpu
     << "; LibTorch " << r.machine.torch_version << ", OpenCV " << r.machine.opencv_version << ", libjpeg-turbo "
     << r.machine.jpeg_turbo_version << "\n";
  os.unsetf(std::ios::floatfield);
}

void writeDawnbench(const std::string& dir, const Report& r, const Config& c) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  AIACC_CHECK_INPUT(!ec, "cannot create --dawnbench-dir '", dir, "': ", ec.message());
  const std::string name = "aiacc_" + r.arch + "_" + std::to_string(r.world) + "proc";
  const std::string hardware = r.machine.gpu == "none" ? strCat(r.world, " CPU process(es), ", r.machine.cores,
                                                                " cores (", r.machine.cpu, ")")
                                                       : strCat(r.world, " GPU process(es) on ",
                                                                r.machine.gpu);  // (gpu: the host's "N x NAME")
  const Json misc{{"recipeFile", c.recipe},
                  {"recipe", c.recipe_text},
                  {"timeToTargetSeconds", r.target_reached ? r.time_to_target_s : -1.0},
                  {"targetTop5", r.target_top5},
                  {"targetTop1", r.target_top1},
                  {"epochs", r.epochs},
                  {"skippedFiles", r.skipped_files},
                  {"machine", machineJson(r.machine)}};
  const Json json{{"version", "v1.0"},
                  {"author", c.author},
                  {"authorEmail", ""},
                  {"framework", "aiacc (LibTorch " + r.machine.torch_version + ")"},
                  {"codeURL", ""},
                  {"model", r.arch},
                  {"hardware", hardware},
                  {"costPerHour", c.cost_per_hour},
                  {"timestamp", isoTimestamp()},
                  {"misc", misc}};
  writeFileAtomic(dir + "/" + name + ".json", toJsonLine(json) + "\n");
  std::ostringstream tsv;
  tsv << "epoch\thours\ttop1Accuracy\ttop5Accuracy\n";
  for (const EvalPoint& e : r.evals) {
    tsv << std::setprecision(6) << e.epoch << "\t" << e.seconds / 3600.0 << "\t" << e.top1 << "\t" << e.top5 << "\n";
  }
  writeFileAtomic(dir + "/" + name + ".tsv", tsv.str());
}

}  // namespace aiacc::app
