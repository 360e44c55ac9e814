#include "app/option_names.h"

#include <initializer_list>
#include <vector>

#include "aiacc/common/error.h"

namespace aiacc::app {
namespace {

template <typename E>
struct Named {
  E value;
  const char* name;
};

// The one table of each enum's names, in the order the messages list them.
template <typename E>
constexpr std::initializer_list<Named<E>> kNames = {};
template <>
constexpr std::initializer_list<Named<comm::TransferDtype>> kNames<comm::TransferDtype> = {
    {comm::TransferDtype::kFloat32, comm::transferDtypeName(comm::TransferDtype::kFloat32)},
    {comm::TransferDtype::kFloat16, comm::transferDtypeName(comm::TransferDtype::kFloat16)},
    {comm::TransferDtype::kBFloat16, comm::transferDtypeName(comm::TransferDtype::kBFloat16)},
};
template <>
constexpr std::initializer_list<Named<comm::BufferSync>> kNames<comm::BufferSync> = {
    {comm::BufferSync::kAverageWhenRead, comm::bufferSyncName(comm::BufferSync::kAverageWhenRead)},
    {comm::BufferSync::kAverage, comm::bufferSyncName(comm::BufferSync::kAverage)},
    {comm::BufferSync::kBroadcast, comm::bufferSyncName(comm::BufferSync::kBroadcast)},
    {comm::BufferSync::kNone, comm::bufferSyncName(comm::BufferSync::kNone)},
};
template <>
constexpr std::initializer_list<Named<comm::TwoLevelMode>> kNames<comm::TwoLevelMode> = {
    {comm::TwoLevelMode::kOn, "on"},
    {comm::TwoLevelMode::kOff, "off"},
    {comm::TwoLevelMode::kAuto, "auto"},
};
template <>
constexpr std::initializer_list<Named<AmpDtype>> kNames<AmpDtype> = {
    {AmpDtype::kFp16, "fp16"},
    {AmpDtype::kBf16, "bf16"},
};
template <>
constexpr std::initializer_list<Named<LrSchedule>> kNames<LrSchedule> = {
    {LrSchedule::kCosine, "cosine"},
    {LrSchedule::kStep, "step"},
    {LrSchedule::kLinear, "linear"},
};
template <>
constexpr std::initializer_list<Named<ElasticBatch>> kNames<ElasticBatch> = {
    {ElasticBatch::kKeepPerRank, "keep-per-rank"},
    {ElasticBatch::kKeepGlobal, "keep-global"},
};

template <typename E>
const char* nameIn(E v) {
  for (const auto& row : kNames<E>) {
    if (row.value == v) return row.name;
  }
  AIACC_THROW(Error, "internal: option value ", static_cast<int>(v), " has no name");
}

}  // namespace

const char* optionName(comm::TransferDtype v) { return nameIn(v); }
const char* optionName(comm::BufferSync v) { return nameIn(v); }

std::string flagHint(comm::CommError::Remedy remedy) {
  using R = comm::CommError::Remedy;
  switch (remedy) {
    case R::kStore: return " (aiacc_train: the store's address and port are --master HOST:PORT, the job id --job-id)";
    case R::kBucketSize: return " (aiacc_train: --bucket-mb)";
    case R::kModel: return " (aiacc_train: --arch, and the dataset's classes)";
    case R::kSharedMemory: return " (aiacc_train: --noshm)";
    case R::kMembership: return " (aiacc_train: --nnodes MIN:MAX and --rdzv-timeout)";
    case R::kNone: break;
  }
  return "";
}
const char* optionName(comm::TwoLevelMode v) { return nameIn(v); }
const char* optionName(AmpDtype v) { return nameIn(v); }
const char* optionName(LrSchedule v) { return nameIn(v); }
const char* optionName(ElasticBatch v) { return nameIn(v); }

template <typename E>
std::optional<E> optionFromName(const std::string& name) {
  for (const auto& row : kNames<E>) {
    if (name == row.name) return row.value;
  }
  return std::nullopt;
}

template <typename E>
std::string optionNames(const char* extra) {
  std::vector<const char*> names;
  for (const auto& row : kNames<E>) names.push_back(row.name);
  if (extra) names.push_back(extra);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

void throwBadOption(const char* flag, const std::string& allowed, const std::string& got) {
  AIACC_THROW(InputError, flag, " must be ", allowed, " (got '", got, "')");
}

#define AIACC_OPTION_ENUM(E)                                            \
  template std::optional<E> optionFromName<E>(const std::string& name); \
  template std::string optionNames<E>(const char* extra);
AIACC_OPTION_ENUM(comm::TransferDtype)
AIACC_OPTION_ENUM(comm::BufferSync)
AIACC_OPTION_ENUM(comm::TwoLevelMode)
AIACC_OPTION_ENUM(AmpDtype)
AIACC_OPTION_ENUM(LrSchedule)
AIACC_OPTION_ENUM(ElasticBatch)
#undef AIACC_OPTION_ENUM

}  // namespace aiacc::app
