#include "app/command.h"

#include <utility>

#include "aiacc/common/error.h"

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

}  // namespace aiacc::app
