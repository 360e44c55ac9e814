// A process group from a launcher's environment in one call: the rendezvous store, the ranks'
// agreement on what they must share, and the transports DataParallel runs on.
//
//   auto group = aiacc::comm::initProcessGroup();   // torchrun, Slurm, MPI, Kubeflow, ...
//   aiacc::comm::DataParallel dp(model, group.transports.primary, group.world);
//
// initProcessGroup reads the variables of whichever launcher started the process
// (docs/comm.md lists them), then calls connectProcessGroup, the explicit form that
// aiacc_train uses with its own launch plan. Keep the returned group for the whole job: rank 0's
// process hosts the store's server (unless the launcher's agent does), and the transports hold it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

#include "aiacc/comm/options.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

struct ProcessGroupOptions {
  // The transports: channels, timeout, GPU or CPU, shared memory, two-level reduction.
  // transports.world: filled by initProcessGroup from the environment; given to
  // connectProcessGroup.
  TransportSpec transports;
  // The rendezvous: timeout, key prefix, job id. host, port, rank, world and client_only: filled by
  // initProcessGroup; given to connectProcessGroup (rank and world must be transports.world's).
  StoreOptions store;
  // What every rank must share (a model's name, a batch size, a data set's size): compared over
  // the store before any transport is made. A rank that differs fails every rank at once with an
  // InputError naming the setting and both values, instead of a hang or a wrong sum later.
  Settings settings;
  // The launcher gave each rank's place but not its host's ranks (plain RANK/WORLD_SIZE/MASTER_*
  // without LOCAL_*): the ranks find out through the store whether they all run on one host
  // (same hostname and boot id), and if so take local ranks of that host, so that the
  // transports use shared memory. Ranks on several hosts keep one rank per host (Gloo between
  // them). A few store requests per rank. initProcessGroup sets it when the launcher is silent.
  bool find_local_ranks = false;
  // This process's host, as find_local_ranks compares it (empty: hostname and boot id; tests set it).
  std::string host_id;
  // A store already made, that every rank reaches (ranks as threads over one makeHashStore(), or
  // a store of the program's own): used, under the prefix and key log of `store` above, instead
  // of the TCP store its address names (its host, port, port_tries, client_only and job unused).
  c10::intrusive_ptr<c10d::Store> shared_store;
};

struct ProcessGroup {
  WorldInfo world;
  c10::intrusive_ptr<c10d::Store> store;  // keep it: rank 0 hosts the server
  Transports transports;                  // transports.primary is DataParallel's
  LaunchSource source = LaunchSource::kNone;
  std::string describe() const;  // one line: the launcher, the world, the transports
};

// The explicit form: checkLayoutSupported (every rank refuses an impossible layout at once, before
// it waits for peers), the store (makeTcpStore, or shared_store), the agreement on options.settings, then
// makeTransports. Throws InputError for bad options or ranks that disagree, CommError when a
// rank does not arrive within the store's timeout.
ProcessGroup connectProcessGroup(const ProcessGroupOptions& options);

// Reads the launcher's environment (detectLaunch(env)) and AIACC_STREAMS (at least that many
// channels; data_parallel_options.h parses every AIACC_* variable, and refuses, here
// already, a value of any of them it cannot read), fills
// options.transports.world and the store's address, rank, world, key prefix and job id, then
// connects. The store is at the
// launcher's MASTER_ADDR:MASTER_PORT (or its own variables; Slurm: the step's first host); with
// torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) every rank connects as a client.
// Without a launcher, or with a world of 1, the group is this process alone, over an in-memory
// store (DataParallel then exchanges nothing). Throws InputError when the variables are
// inconsistent, when they describe a node rather than a rank (Kubeflow's PET_* without torchrun),
// or when ranks on several hosts have no store address.
ProcessGroup initProcessGroup(ProcessGroupOptions options = {}, const EnvMap& env = currentEnvironment());

}  // namespace aiacc::comm
