#include "aiacc/comm/data_parallel_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "aiacc/common/error.h"

namespace aiacc::comm {
namespace {

std::string exact(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

template <typename T>
std::string list(const std::vector<T>& v) {
  std::string s;
  for (const T& x : v) s += (s.empty() ? "" : ",") + exact(static_cast<double>(x));
  return "[" + s + "]";
}

const char* onOff(bool b) { return b ? "on" : "off"; }

// Each variable's parser: the value into the options, or false when it cannot be read.
using Apply = bool (*)(const std::string&, DataParallelOptions&);

bool readDouble(const std::string& s, double* out) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool readInt(const std::string& s, long lo, long hi, int* out) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool readBool(const std::string& s, bool* out) {
  if (s == "1" || s == "on" || s == "true" || s == "yes") {
    *out = true;
  } else if (s == "0" || s == "off" || s == "false" || s == "no") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

bool positiveMb(const std::string& s, double* out) {
  double v = 0;
  if (!readDouble(s, &v) || v <= 0) return false;
  *out = v;
  return true;
}

struct Knob {
  EnvKnob doc;
  Apply apply;
};

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k =
      {
          {{"AIACC_BUCKET_MB", "reducer.bucket_mb", "MiB > 0"},
           [](const std::string& s, DataParallelOptions& o) { return positiveMb(s, &o.reducer.bucket_mb); }},
          {{"AIACC_FIRST_BUCKET_MB", "reducer.first_bucket_mb", "MiB > 0"},
           [](const std::string& s, DataParallelOptions& o) { return positiveMb(s, &o.reducer.first_bucket_mb); }},
          {{"AIACC_ALLREDUCE_DTYPE", "codec.dtype", "fp32, fp16 or bf16"},
           [](const std::string& s, DataParallelOptions& o) {
    for (TransferDtype t : {TransferDtype::kFloat32, TransferDtype::kFloat16, TransferDtype::kBFloat16}) {
      if (s == transferDtypeName(t)) {
        o.codec.dtype = t;
        return true;
      }
    }
    return false;
           }},
          {{"AIACC_GRAD_SCALE", "codec.grad_scale", "a number > 0"},
           [](const std::string& s, DataParallelOptions& o) { return positiveMb(s, &o.codec.grad_scale); }},
          {{"AIACC_STREAMS", "striping.channels", "1..16"},
           [](const std::string& s, DataParallelOptions& o) {
    return readInt(s, 1, 16, &o.striping.channels);
           }},
                                 {{"AIACC_BN_SYNC", "buffers", "lazy, average, broadcast or none"},
                                  [](const std::string& s, DataParallelOptions& o) {
    for (BufferSync b :
         {BufferSync::kAverageWhenRead, BufferSync::kAverage, BufferSync::kBroadcast, BufferSync::kNone}) {
      if (s == bufferSyncName(b)) {
        o.buffers = b;
        return true;
      }
    }
    return false;
                                  }},
      {{"AIACC_FIND_UNUSED", "reducer.detect_unused", "1, on, true, yes or 0, off, false, no"},
       [](const std::string& s, DataParallelOptions& o) { return readBool(s, &o.reducer.detect_unused); }},
      {{"AIACC_AUTOTUNE", "autotune", "1, on, true, yes or 0, off, false, no"},
       [](const std::string& s, DataParallelOptions& o) { return readBool(s, &o.autotune); }},
      };
  return k;
}

}  // namespace

Settings optionSettings(const DataParallelOptions& o) {
  return {
      {"reducer.bucket_mb", exact(o.reducer.bucket_mb)},
      {"reducer.first_bucket_mb", exact(o.reducer.first_bucket_mb)},
      {"reducer.detect_unused", onOff(o.reducer.detect_unused)},
      {"reducer.launch_in_backward", onOff(o.reducer.launch_in_backward)},
      {"reducer.rebuild_after_first_step", onOff(o.reducer.rebuild_after_first_step)},
      {"reducer.hook", o.reducer.hook ? o.reducer.hook->name() : "none"},
      {"codec.dtype", transferDtypeName(o.codec.dtype)},
      {"codec.grad_scale", exact(o.codec.grad_scale)},
      {"codec.scale_growth_steps", std::to_string(o.codec.scale_growth_steps)},
      {"striping.channels", std::to_string(o.striping.channels)},
      {"striping.balance", onOff(o.striping.balance)},
      {"striping.balance_alpha", exact(o.striping.balance_alpha)},
      {"striping.min_split_bytes", std::to_string(o.striping.min_split_bytes)},
      {"buffers", bufferSyncName(o.buffers)},
      {"broadcast_parameters", onOff(o.broadcast_parameters)},
      {"finish_in_backward", onOff(o.finish_in_backward)},
      {"autotune", onOff(o.autotune)},
      {"tune.bucket_mb", list(o.tune.bucket_mb)},
      {"tune.channels", list(o.tune.channels)},
      {"tune.try_two_level", onOff(o.tune.try_two_level)},
      {"tune.steps_per_trial", std::to_string(o.tune.steps_per_trial)},
      {"tune.min_gain", exact(o.tune.min_gain)},
      {"tune.confirm", onOff(o.tune.confirm)},
      {"two_level", o.two_level ? "given" : "none"},
  };
}

const std::vector<EnvKnob>& envKnobs() {
  static const std::vector<EnvKnob> docs = [] {
    std::vector<EnvKnob> d;
    for (const Knob& k : knobs()) d.push_back(k.doc);
    return d;
  }();
  return docs;
}

std::vector<std::string> applyEnvironment(DataParallelOptions& options, const EnvMap& env) {
  std::vector<std::string> applied;
  DataParallelOptions o = options;  // all or nothing: `options` changes only when every value reads
  for (const Knob& k : knobs()) {
    const auto it = env.find(k.doc.name);
    if (it == env.end() || it->second.empty()) continue;
    AIACC_CHECK_INPUT(k.apply(it->second, o), k.doc.name, "='", it->second, "': must be ", k.doc.values,
                      " (it sets DataParallelOptions::", k.doc.sets, "; unset it for the default)");
    applied.push_back(k.doc.name);
  }
  options = std::move(o);
  return applied;
}

DataParallelOptions optionsFromEnvironment(const EnvMap& env) {
  DataParallelOptions o;
  applyEnvironment(o, env);
  return o;
}

}  // namespace aiacc::comm
