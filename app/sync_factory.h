// How a worker makes its GradientSync (app/trainer.h SyncFactory) from its launch: LocalSync for
// a world of one; else the rendezvous store, the agreement of every rank's settings, the
// transports and DataParallel around the model (comm::connectProcessGroup). An elastic job's
// factory makes the current generation's at each call (its world, its keys' prefix).
// runWorker (app/command_train.cc) makes one per process; tests with ranks as threads make one per
// rank over a store they share (SyncFactorySpec::shared_store).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "aiacc/comm/timeline.h"
#include "app/flags.h"
#include "app/launch_env.h"
#include "app/trainer.h"

namespace aiacc::app {

class ElasticJob;

// Where the factory keeps the store of the group it made last, for the whole job (rank 0 hosts
// it: a process of another job that reaches the port later is refused with a message instead of
// timing out as it connects; a job of fixed size claims its survivor's save there).
using StoreSlot = std::shared_ptr<c10::intrusive_ptr<c10d::Store>>;

struct SyncFactorySpec {
  comm::WorldInfo launched;                  // the launcher's world (an elastic job's comes from `elastic`)
  DistSpec dist;                             // the communication flags
  StoreAddress address;                      // the store's address, key prefix and job id
  std::shared_ptr<comm::Timeline> timeline;  // rank 0's --timeline (null: none)
  StoreSlot keep = std::make_shared<c10::intrusive_ptr<c10d::Store>>();
  std::shared_ptr<ElasticJob> elastic;  // an elastic job's membership, joined (null: fixed size)
  // A store every rank reaches already (ranks as threads over one comm::makeHashStore()): used
  // instead of connecting to `address` (comm::ProcessGroupOptions::shared_store); its key prefix
  // still applies.
  c10::intrusive_ptr<c10d::Store> shared_store;
};

SyncFactory makeSyncFactory(SyncFactorySpec spec);

}  // namespace aiacc::app
