// DataParallel used wrongly: a one-line InputError that says what to do, never a crash or a hang.
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>

#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/process_group.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {
namespace {

// Runs make() and returns the InputError's message ("" when none was thrown).
template <typename F>
std::string inputErrorOf(F&& make) {
  try {
    make();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(CommMisuse, DataParallelWithoutATransportOrModelIsOneLine) {
  auto model = std::make_shared<torch::nn::LinearImpl>(2, 1);
  const WorldInfo one{};
  std::string e = inputErrorOf([&] { DataParallel dp(model, nullptr, one); });
  EXPECT_NE(e.find("the transport is null: make the process group first"), std::string::npos) << e;

  ProcessGroup group = initProcessGroup({}, EnvMap{});
  e = inputErrorOf([&] { DataParallel dp(nullptr, group.transports.primary, group.world); });
  EXPECT_NE(e.find("the model is null"), std::string::npos) << e;

  // A world that is not the transport's.
  e = inputErrorOf([&] { DataParallel dp(model, group.transports.primary, WorldInfo{0, 2, 0, 2}); });
  EXPECT_NE(e.find("the transport is rank 0 of 1, the world given says 0 of 2"), std::string::npos) << e;

  // Used as meant, it is a world of one.
  DataParallel dp(model, group.transports.primary, group.world);
  EXPECT_EQ(dp.world().world, 1);
}

}  // namespace
}  // namespace aiacc::comm
