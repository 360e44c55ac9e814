#include "app/dry_run.h"

#include <sstream>

namespace aiacc::app {
namespace {

std::string who(const LaunchPlan& plan, const DistSpec& dist) {
  std::ostringstream os;
  const std::string device = dist.gpus > 0 ? " GPU" : " CPU";
  switch (plan.role) {
    case LaunchPlan::Role::kSingle: os << "one" << device << " process (no launcher)"; break;
    case LaunchPlan::Role::kSpawn: {
      const LaunchSpec& s = plan.spawn;
      os << "a launcher: " << s.nproc << device << " worker(s) on node " << s.node_rank << " of ";
      if (s.min_nodes > 0) {
        os << s.min_nodes << ":" << s.nnodes << " (elastic)";
      } else {
        os << s.nnodes;
      }
      os << "; store "
         << (s.external_store ? "served apart at " + s.master
             : s.pick_port
                 ? std::string("on this node, at a free port")
                 : "at " + s.master +
                       (s.master_ports > 1 ? " or one of the next " + std::to_string(s.master_ports - 1) + " ports"
                                           : ""));
      if (plan.source != LaunchSource::kNone) os << "; node layout from " << sourceName(plan.source);
      break;
    }
    case LaunchPlan::Role::kWorker:
      os << "rank " << plan.world.rank << " of " << plan.world.world << " (local " << plan.world.local_rank << " of "
         << plan.world.local_size << ")" << device << ", started by " << sourceName(plan.source)
         << (plan.min_nodes > 0 ? ", elastic" : "") << "; store at " << plan.store.master
         << (plan.store.ports > 1 ? " or one of the next " + std::to_string(plan.store.ports - 1) + " ports" : "")
         << (plan.store.agent_hosted ? " (the launcher's)" : "");
      break;
  }
  return os.str();
}

}  // namespace

std::string describeRun(const LaunchPlan& plan, const DistSpec& dist, const Config& c) {
  std::ostringstream os;
  os << "aiacc_train --dry-run: the command line is valid\n";
  os << "  runs:        " << who(plan, dist) << "\n";
  os << "  trains:      " << c.arch << " on " << c.data << ", " << c.epochs << " epoch(s)";
  if (c.max_steps > 0) os << ", at most " << c.max_steps << " step(s)";
  os << "\n";
  for (const Stage& s : c.stages) {
    os << "  stage:       from epoch " << s.start_epoch << ", " << s.image_size << " px, batch " << s.batch_size
       << " per process\n";
  }
  os << "  target:      ";
  if (c.target_top1 <= 0 && c.target_top5 <= 0) os << "none (the schedule's end)";
  if (c.target_top1 > 0) os << "top-1 " << c.target_top1 << "% ";
  if (c.target_top5 > 0) os << "top-5 " << c.target_top5 << "%";
  os << "\n  checkpoints: " << (c.checkpoint_dir.empty() ? std::string("none (--checkpoint-dir)") : c.checkpoint_dir);
  if (!c.resume.empty()) os << ", resume " << c.resume;
  os << "\n";
  return os.str();
}

}  // namespace aiacc::app
