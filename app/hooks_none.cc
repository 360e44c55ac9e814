// aiacc_train's hooks: none (app/binary_hooks.h).
#include "app/binary_hooks.h"

namespace aiacc::app {

TestHooks hooksOfThisBinary() { return {}; }

}  // namespace aiacc::app
