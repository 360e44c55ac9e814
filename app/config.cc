#include "app/config.h"

#include <cmath>
#include <sstream>

#include "aiacc/common/error.h"
#include "aiacc/common/parse_number.h"

namespace aiacc::app {

const Stage& stageAt(const Config& c, int epoch) {
  AIACC_CHECK(!c.stages.empty(), "no stages");
  const Stage* s = &c.stages.front();
  for (const Stage& st : c.stages) {
    if (st.start_epoch <= epoch) s = &st;
  }
  return *s;
}

double learningRate(const Config& c, double pos, int64_t global_batch) {
  const double peak = c.lr * static_cast<double>(global_batch) / 256.0;
  if (pos < c.warmup_epochs) return peak * pos / c.warmup_epochs;
  const double span = std::max(1e-9, c.epochs - c.warmup_epochs);
  const double t = std::min(1.0, (pos - c.warmup_epochs) / span);
  switch (c.lr_schedule) {
    case LrSchedule::kCosine: return peak * 0.5 * (1.0 + std::cos(M_PI * t));
    case LrSchedule::kLinear: return peak * (1.0 - t);
    case LrSchedule::kStep: {
      double lr = peak;
      for (int e : c.lr_step_epochs) {
        if (pos >= e) lr *= c.lr_step_gamma;
      }
      return lr;
    }
  }
  AIACC_THROW(Error, "internal: unknown LrSchedule ", static_cast<int>(c.lr_schedule));
}

double meanLossWeight(int64_t images, int64_t global_batch, int world) {
  AIACC_CHECK(global_batch > 0 && world >= 1, "global batch ", global_batch, ", world ", world);
  return static_cast<double>(images) * world / static_cast<double>(global_batch);
}

namespace {
// s without the blanks around it ("0:128, 10:192" reads as it did with std::stoi).
std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
}  // namespace

std::vector<Stage> parseResizeSchedule(const std::string& spec, int batch_size, double scale_min) {
  std::vector<Stage> stages;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto colon = item.find(':');
    Stage s;
    const std::optional<int> epoch = colon == std::string::npos ? std::nullopt
                                                                : parseInteger<int>(trimmed(item.substr(0, colon)));
    const std::optional<int> size = colon == std::string::npos ? std::nullopt
                                                               : parseInteger<int>(trimmed(item.substr(colon + 1)));
    AIACC_CHECK_INPUT(epoch && size, "--resize-schedule '", spec,
                      "' is malformed: expected EPOCH:SIZE[,EPOCH:SIZE...], e.g. 0:128,10:192,14:224");
    s.start_epoch = *epoch;
    s.image_size = *size;
    AIACC_CHECK_INPUT(s.image_size >= 16, "--resize-schedule: image size ", s.image_size, " too small");
    AIACC_CHECK_INPUT(stages.empty() ? s.start_epoch == 0 : s.start_epoch > stages.back().start_epoch,
                      "--resize-schedule '", spec, "': epochs must start at 0 and increase");
    s.batch_size = batch_size;
    s.scale_min = scale_min;
    stages.push_back(s);
  }
  AIACC_CHECK_INPUT(!stages.empty(), "--resize-schedule is empty");
  return stages;
}

void requireData(const Config& c) {
  AIACC_CHECK_INPUT(!c.data.empty(), "no --data given (an ImageNet-layout folder, or 'synthetic'; "
                                     "scripts/run.sh generates a sample dataset)");
}

}  // namespace aiacc::app
