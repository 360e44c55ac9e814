#include "app/command.h"

#include <iostream>
#include <utility>

#include "aiacc/comm/comm_error.h"
#include "aiacc/common/error.h"
#include "app/exit_code.h"
#include "app/option_names.h"

namespace aiacc::app {

RunOptions runOptionsFromFlags() {
  RunOptions o;
  o.recipe = applyRecipeFlag();  // before any option is built
  o.dist = distSpecFromFlags();
  o.config = configFromFlags(o.recipe);
  if (!o.dist.rendezvous_server) {
    requireData(o.config);
    o.launch_env = detectLaunch(currentEnvironment());
    o.plan = planLaunch(o.launch_env, o.dist.launch_flags);
    AIACC_CHECK_INPUT(o.dist.launch.max_restarts == 0 || o.plan.role == LaunchPlan::Role::kWorker ||
                          (o.plan.role == LaunchPlan::Role::kSpawn && o.plan.spawn.min_nodes > 0),
                      "--max-restarts needs an elastic job (--nnodes MIN:MAX): without one a lost rank ends the job");
  }
  return o;
}

int errorExit(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const comm::CommError& e) {  // the library names the setting; this adds our flag for it
    std::cerr << "aiacc_train: error: " << e.what() << flagHint(e.remedy()) << "\n";
  } catch (const Error& e) {
    std::cerr << "aiacc_train: error: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "aiacc_train: internal error: " << firstLine(e.what()) << "\n";
  } catch (...) {
    std::cerr << "aiacc_train: internal error: an exception of unknown type\n";
  }
  return exitCode(Ending{Ending::How::kError});
}

}  // namespace aiacc::app
