#include "app/elastic.h"

#include <c10/util/Exception.h>
#include <glog/logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>
#include <regex>
#include <system_error>
#include <utility>
#include <variant>

#include "app/flags.h"
#include "app/launch_env.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"
#include "aiacc/common/parse_number.h"

namespace aiacc::app {
namespace {
// Where a rank's list of its keys is published, under its generation's prefix.
std::string keyListName(int rank) { return "keys/" + std::to_string(rank); }

// `doing`: what this process asked the store for ("regrouped", ...).
StoreLostError storeFailed(const std::exception& e, const std::string& doing = "regrouped") {
  return StoreLostError(strCat("elastic: the rendezvous store failed while this process ", doing, " (",
                               firstLine(e.what()),
                               "): the job has ended, or the process that served the store (node 0's launcher, or "
                               "the --rdzv-endpoint server) is gone"));
}
}  // namespace

std::vector<int> lostRanksIn(const std::string& message) {
  static const std::regex gone(R"(rank (\d+) (died|stopped responding))");
  std::vector<int> out;
  for (std::sregex_iterator it(message.begin(), message.end(), gone), end; it != end; ++it) {
    const std::optional<int> r = parseInteger<int>((*it)[1].str());
    if (!r) continue;  // (digits past int's range: no rank of a job)
    if (std::find(out.begin(), out.end(), *r) == out.end()) out.push_back(*r);
  }
  return out;
}

ElasticJob::ElasticJob(c10::intrusive_ptr<c10d::Store> store, ElasticOptions options,
                       c10::intrusive_ptr<c10d::Store> beat_store)
    : o_(std::move(options)), store_(store), membership_(std::move(store), o_.membership),
      beat_store_(std::move(beat_store)) {
  if (!beat_store_) return;
  beater_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(beat_mutex_);
    while (!beat_stop_cv_.wait_for(lock, comm::kBeatInterval, [this] { return beat_stop_; })) {
      const int64_t g = beating_.load();
      if (g < 0) continue;
      lock.unlock();  // (a store request may take long: the destructor does not wait on the lock meanwhile)
      try {
        comm::beat(*beat_store_, g);
      } catch (const std::exception&) {  // the store gone: the training thread meets it too, and says so
      }
      lock.lock();
    }
  });
}

ElasticJob::~ElasticJob() {
  if (!beater_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(beat_mutex_);
    beat_stop_ = true;
  }
  beat_stop_cv_.notify_all();
  beater_.join();
}

std::shared_ptr<ElasticJob> makeElasticJob(const DistSpec& dist, const LaunchPlan& plan) {
  AIACC_CHECK_INPUT(plan.source == LaunchSource::kAiacc && plan.store.agent_hosted,
                    "--nnodes MIN:MAX needs the rendezvous store outside the workers: start the job with "
                    "aiacc_train's own launcher on each node (--nproc N --nnodes MIN:MAX --node-rank K --master "
                    "HOST:PORT), not under ",
                    sourceName(plan.source));
  const comm::WorldInfo& w = plan.world;
  const auto [host, port] = parseHostPort(plan.store.master);
  comm::StoreOptions so;
  so.host = host;
  so.port = port;
  so.rank = w.rank;
  so.world = w.world;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(dist.timeout_s * 1000));
  so.prefix = plan.store.key_prefix;
  so.client_only = true;
  so.job = plan.store.job;
  so.port_tries = plan.store.ports;
  ElasticOptions o;
  // MIN from the launcher (AIACC_ELASTIC_MIN_NODES: --nnodes or PET_NNODES), MAX: its world.
  const int min_nodes = plan.min_nodes > 0 ? plan.min_nodes : dist.launch.min_nodes;
  o.membership.min = std::min(min_nodes * w.local_size, w.world);
  o.membership.max = w.world;
  o.membership.timeout = dist.launch.rdzv_timeout;
  o.membership.last_call = std::chrono::milliseconds(static_cast<int64_t>(dist.rdzv_last_call_s * 1000));
  o.membership.waiting_to_join = [](int64_t generation) {
    LOG(INFO) << kWaitingToJoin << generation
              << " of the running job (its rank 0 looks for newcomers at each step boundary)";
  };
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') std::strcpy(name, "localhost");
  o.node = name;  // the host: processes on one host reach each other through shared memory
  for (char& c : o.node) {
    if (c == ' ' || c == '\t' || c == '\n') c = '_';
  }
  o.launch_rank = w.rank;
  // (The beats over a connection of their own: a store client serves one thread. A beat later
  // than beat_stale is worth nothing: its requests time out sooner, so that an unreachable store
  // cannot hold the process's end for --comm-timeout.)
  comm::StoreOptions beats = so;
  beats.timeout = std::min(so.timeout, std::chrono::milliseconds(o.membership.beat_stale));
  return std::make_shared<ElasticJob>(comm::makeTcpStore(so), o, comm::makeTcpStore(beats));
}

std::optional<comm::JobEnded> ElasticJob::start() {
  std::random_device random;
  std::ostringstream id;
  id << std::hex << random() << random();
  const std::string mine = id.str();
  const std::vector<uint8_t> agreed = store_->compareSet("run_id", {}, std::vector<uint8_t>(mine.begin(), mine.end()));
  run_id_.assign(agreed.begin(), agreed.end());
  comm::Member self;
  self.rank = o_.launch_rank;
  self.node = o_.node;
  return enter(membership_.join(self));
}

std::optional<comm::JobEnded> ElasticJob::enter(comm::Membership::Joined joined) {
  if (auto* ended = std::get_if<comm::JobEnded>(&joined)) return std::move(*ended);
  generation_ = std::get<comm::Generation>(std::move(joined));
  beating_ = generation_.number;
  return std::nullopt;
}

std::optional<comm::JobEnded> ElasticJob::regroup(int64_t step, const std::string& cause,
                                                  const std::vector<int>& also_gone) {
  AIACC_CHECK(joined(), "regroup before start");
  comm::Member self = generation_.members[static_cast<size_t>(generation_.rank)];
  self.generation = generation_.number;
  self.rank = generation_.rank;
  self.step = step;
  const int before = generation_.size();
  try {
    // (A generation that failed before its keys were deleted: its own keys go with it now; the
    // lost ranks' of the one before it stay.)
    if (previous_keys_) previous_keys_->deleteOwn(*keysOf(previous_number_), keyListName(previous_rank_));
    previous_keys_ = keys_;
    previous_number_ = generation_.number;
    previous_rank_ = generation_.rank;
    previous_world_ = before;
    keys_ = std::make_shared<comm::KeyLog>();
    std::vector<int> gone = lostRanksIn(cause);
    for (const int r : also_gone) {
      if (std::find(gone.begin(), gone.end(), r) == gone.end()) gone.push_back(r);
    }
    comm::Membership::Joined joined = membership_.join(self, gone, before);
    store_lost_ = false;  // (it answered)
    return enter(std::move(joined));
  } catch (const comm::CommError& e) {
    if (e.remedy() != comm::CommError::Remedy::kMembership || !membership_.leftOut()) throw;
    throw leftOut(e);
  } catch (const c10::Error& e) {  // the store's own failures: a closed connection, a timeout
    if (membership_.leftOut()) throw leftOut(e);
    throw storeFailed(e);
  } catch (const std::system_error& e) {  // (LibTorch 1.13's socket errors: "Broken pipe")
    if (membership_.leftOut()) throw leftOut(e);
    throw storeFailed(e);
  }
}

LeftOutError ElasticJob::leftOut(const std::exception& e) {
  left_out_ = true;
  return LeftOutError(strCat(firstLine(e.what()),
                             "; this process was left out (the others went on past its generation ", generation_.number,
                             " without it): it saves nothing and records no end of the job, which may go on "
                             "without it"));
}

bool ElasticJob::joinersWaiting() {
  if (store_lost_) return false;
  try {
    return membership_.joinersWaiting(generation_);
  } catch (const std::exception& e) {  // c10::Error, or LibTorch 1.13's std::system_error
    store_lost_ = true;
    LOG(WARNING) << firstLine(storeFailed(e, "looked for newcomers").what())
                 << "; no process can join, and the job goes on with its " << generation_.size()
                 << " processes while they last";
    return false;
  }
}

c10::intrusive_ptr<c10d::Store> ElasticJob::keysOf(int64_t generation) const {
  return c10::make_intrusive<c10d::PrefixStore>(comm::Generation::prefixOf(generation), store_);
}

void ElasticJob::publishKeys() { keys_->publish(*keysOf(generation_.number), keyListName(generation_.rank)); }

ElasticJob::KeysDeleted ElasticJob::deletePreviousKeys() {
  KeysDeleted n;
  if (!previous_keys_) return n;
  const c10::intrusive_ptr<c10d::Store> old = keysOf(previous_number_);
  n.generation = previous_number_;
  n.own = previous_keys_->deleteOwn(*old, keyListName(previous_rank_));
  if (generation_.rank == 0) {
    for (const int r : generation_.lostFrom(previous_world_))
      n.lost += comm::KeyLog::deleteKeysOf(*old, keyListName(r));
  }
  previous_keys_.reset();
  return n;
}

}  // namespace aiacc::app
