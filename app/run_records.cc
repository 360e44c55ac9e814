#include "app/run_records.h"

#include <gflags/gflags.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "aiacc/common/json.h"

namespace aiacc::app {
namespace {

// The shortest form that reads back the same, fixed or scientific whichever is shorter: 20, 0.1,
// 1e-05 (std::to_chars); NaN and infinities as an empty cell.
std::string number(double v) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}
std::string cell(double v) { return std::isfinite(v) ? number(v) : std::string(); }

}  // namespace

std::string summaryCsv(const std::vector<EpochTrain>& epochs, const std::vector<EvalPoint>& evals) {
  std::ostringstream csv;
  csv << "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n";
  double begin = 0;
  for (const EpochTrain& e : epochs) {
    const EvalPoint* last = nullptr;  // the last evaluation within (begin, e.epoch]
    for (const EvalPoint& p : evals) {
      if (p.epoch > begin + 1e-9 && p.epoch <= e.epoch + 1e-9) last = &p;
    }
    csv << number(e.epoch) << "," << cell(e.loss) << ",";
    if (last) {
      csv << cell(last->loss) << "," << cell(last->top1) << "," << cell(last->top5);
    } else {
      csv << ",,";
    }
    csv << "," << cell(e.lr) << "\n";
    begin = e.epoch;
  }
  return csv.str();
}

std::string argsJson(const std::vector<std::pair<std::string, std::string>>& flags) {
  Json j = Json::object();
  for (const auto& [name, value] : flags) {
    gflags::CommandLineFlagInfo info;
    const std::string type = gflags::GetCommandLineFlagInfo(name.c_str(), &info) ? info.type : "string";
    if (type == "bool") {
      j[name] = value == "true";
    } else if (type == "int32" || type == "int64") {
      j[name] = std::strtoll(value.c_str(), nullptr, 10);
    } else if (type == "uint64" || type == "uint32") {
      j[name] = std::strtoull(value.c_str(), nullptr, 10);
    } else if (type == "double") {
      j[name] = std::strtod(value.c_str(), nullptr);
    } else {
      j[name] = value;
    }
  }
  return toJsonText(j) + "\n";
}

std::string argsFlags(const std::vector<std::pair<std::string, std::string>>& flags) {
  std::string out;
  for (const auto& [name, value] : flags) out += "--" + name + "=" + value + "\n";
  return out;
}

void writeRunRecords(const std::string& report_file, const Report& r,
                     const std::vector<std::pair<std::string, std::string>>& resolved,
                     const std::vector<std::pair<std::string, std::string>>& given) {
  const std::filesystem::path dir = std::filesystem::path(report_file).parent_path();
  auto at = [&](const char* name) { return (dir.empty() ? std::filesystem::path(name) : dir / name).string(); };
  writeFileAtomic(at("summary.csv"), summaryCsv(r.epoch_train, r.evals));
  writeFileAtomic(at("args.json"), argsJson(resolved));
  writeFileAtomic(at("args.flags"), argsFlags(given));
}

}  // namespace aiacc::app
