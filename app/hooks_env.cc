// aiacc_train_hooked's hooks: the AIACC_TEST_* and AIACC_BENCH_* variables (app/binary_hooks.h).
#include "app/binary_hooks.h"

namespace aiacc::app {

TestHooks hooksOfThisBinary() { return testHooksFromEnvironment(); }

}  // namespace aiacc::app
