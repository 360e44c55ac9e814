// What the launch-plan tests share (tests/launch_env_test.cc, tests/launch_env_slurm_test.cc).
#pragma once

#include <string>

#include "aiacc/common/error.h"
#include "app/launch_env.h"
#include "tests/test_util.h"

namespace aiacc::app::launch_test {

// The message of the InputError `f` throws ("" when it throws none).
template <typename F>
std::string errorOf(F f) {
  return test::messageOf<InputError>(f, "");
}

inline LaunchFlags noFlags() { return LaunchFlags{}; }

}  // namespace aiacc::app::launch_test
