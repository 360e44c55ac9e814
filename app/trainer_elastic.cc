// The trainer's side of an elastic job (Trainer::State, app/trainer_state.h): the regroup after a
// lost rank or for a newcomer, the training state handed from the new rank 0 to the others over
// the new transports, and the test log of the samples each step trained.
#include <glog/logging.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <optional>
#include <system_error>
#include <thread>

#include "app/checkpoint.h"
#include "app/optim_state.h"
#include "app/job_settings.h"
#include "aiacc/common/atomic_file.h"
#include "aiacc/common/checkpoint_dir.h"
#include "aiacc/common/file_lock.h"
#include "aiacc/common/crc32c.h"
#include "app/trainer_state.h"
#include "aiacc/common/error.h"

namespace aiacc::app {
namespace {
double secondsOf(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

TrainingState Trainer::State::snapshot() const {
  TrainingState p = pos;
  p.elapsed_s = now();
  if (scaler->enabled()) {
    p.loss_scale = scaler->scale();
    p.loss_scale_good_steps = scaler->goodSteps();
  }
  p.comm = sync_ptr ? sync_ptr->commState() : pos.comm;
  p.settings = continuationSettings();
  p.rng_cpu = at::detail::getDefaultCPUGenerator().get_state();
  if (device.is_cuda()) p.rng_cuda = at::globalContext().defaultGenerator(device).get_state();
  p.classes = class_names;
  p.config = cfg.resolved_flags;
  return p;
}

std::optional<EarlyEnd> Trainer::State::regroup(const std::string& cause, bool step_cut) {
  const auto t_failed = Clock::now();
  MembershipChange change;
  change.cause = cause;
  change.world_before = world;
  change.detect_s = cause.empty() ? 0.0 : secondsOf(t_failed - run.last_step_end);
  const int64_t my_step = pos.step;
  LOG(WARNING) << "elastic: rank " << rank << " leaves generation " << elastic->generation().number
               << (cause.empty() ? std::string(" to let a process join") : ": " + cause);
  // Keep what the old rank 0's comm state said (the new rank 0 sends its own in the state).
  pos.comm = sync().commState();
  // Steps not in a metrics line yet: their images go into the position now (as this rank counts
  // them: every rank decoded its whole share), since the line that would have summed them is not
  // written.
  pos.images_seen += run.window.images_all_ranks;
  run.window = LogWindow{};
  // A flag in flight died with the old generation's vote: rank 0 asks again (a newcomer waiting,
  // --checkpoint-every's time).
  run.regroup_asked = false;
  run.checkpoint_asked = false;
  run.regroup_after_epoch = false;
  sync_ptr.reset();  // the old transports close: every peer still waiting in them is released
  if (late_to_regroup_ms > 0 && rank != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(late_to_regroup_ms));
    LOG(WARNING) << "AIACC_TEST_LATE_TO_REGROUP_MS: rank " << rank << " arrives for the next generation now";
  }
  // A generation whose set-up fails (a newcomer lost while it joins or refused, a rank lost in
  // the state transfer) is left for the next at once by the ranks that hold the state; the
  // newcomers it had are reported gone, so that the next closes without waiting for them.
  const comm::WorldInfo trained_in = world_info;  // the world that trained the state held
  SetUpRetry retry;
  retry.why = cause;
  Clock::time_point t_grouped;
  for (;;) {
    if (std::optional<EarlyEnd> end = regroupOrStop(retry.why, retry.gone)) return end;
    const comm::Generation& g = elastic->generation();
    AIACC_CHECK(g.survivors() > 0, "elastic: generation ", g.number,
                " has no process of the one before, so nobody holds the training state; start the job again "
                "with --resume auto to continue from its newest checkpoint");
    SetUpVerdict verdict;
    try {
      t_grouped = setUpGeneration(g, change.world_before, &change.bytes);
      break;
    } catch (const comm::CommError& e) {
      verdict = leaveFailedSetUp(g, e, true, trained_in, retry);
      if (!verdict.retry && !verdict.stop) throw;
    } catch (const InputError& e) {  // the agreement: a newcomer started with other settings
      verdict = leaveFailedSetUp(g, e, false, trained_in, retry);
      if (!verdict.retry && !verdict.stop) throw;
    } catch (const c10::Error& e) {  // a store request of a transport's set-up (a peer gone meanwhile)
      verdict = leaveFailedSetUp(g, e, true, trained_in, retry);
      if (!verdict.retry && !verdict.stop) throw;
    } catch (const std::system_error& e) {  // (LibTorch 1.13's socket errors)
      verdict = leaveFailedSetUp(g, e, true, trained_in, retry);
      if (!verdict.retry && !verdict.stop) throw;
    }
    if (verdict.stop) return std::move(verdict.stop);
  }
  const comm::Generation& g = elastic->generation();
  const std::vector<std::string> unused = sync().restoreCommState(pos.comm);
  const auto t_restored = Clock::now();
  // Everyone has left the generation before (the restore was a collective of this one).
  const ElasticJob::KeysDeleted deleted = elastic->deletePreviousKeys();
  change.generation = g.number;
  change.world_after = world;
  change.step = pos.step;
  // This rank's completed steps the restored state does not hold, with the step the failure cut
  // (unless the new rank 0 completed it).
  change.steps_lost = std::max<int64_t>(0, my_step + (cause.empty() || !step_cut ? 0 : 1) - pos.step);
  change.regroup_s = secondsOf(t_grouped - t_failed);
  change.restore_s = secondsOf(t_restored - t_grouped);
  run.planned = plannedSteps();
  report.world = world;
  report.membership.push_back(change);
  openRank0Outputs();  // this process may be rank 0 now
  if (isRank0()) {
    LOG(INFO) << "elastic: " << describe(change);
    for (const std::string& line : unused) LOG(INFO) << "elastic: " << line;
    if (deleted.generation >= 0) {
      LOG(INFO) << "elastic: generation " << deleted.generation << "'s store keys deleted: " << deleted.own
                << " of this rank's, " << deleted.lost << " of the ranks lost";
    }
  }
  run.change_began = t_failed;
  run.last_step_end = Clock::now();
  // What this rank's newest checkpoint holds is its own: after a regroup every rank writes one
  // where the run ends, so that the ranks take the same collectives there (trainEpochs).
  run.checkpoint_step = -1;
  return std::nullopt;
}

void Trainer::State::sayNoSurvivor() const {
  const comm::Generation& g = elastic->generation();
  if (g.number == 0 || g.survivors() > 0) return;
  if (pos.step > 0) {
    LOG(WARNING) << "elastic: generation " << g.number << " has no process of the one before (every rank that held "
                 << "the training state is gone): the job goes on from the checkpoint resumed, at step " << pos.step;
  } else {
    LOG(WARNING) << "elastic: generation " << g.number << " has no process of the one before (every rank that held "
                 << "the training state is gone) and resumed no checkpoint: the training starts again from step 0 "
                 << "(to go on from the newest checkpoint instead: --checkpoint-dir DIR --resume auto)";
  }
}

void Trainer::State::enterWorld(const comm::WorldInfo& w) {
  world_info = w;
  rank = w.rank;
  world = w.world;
  train->reshard(rank, world);
  val->reshard(rank, world);
}

Clock::time_point Trainer::State::setUpGeneration(const comm::Generation& g, int world_before, int64_t* bytes) {
  enterWorld(g.world());
  if (fail_setups > 0 && g.survivors() == g.size()) {  // (a test's fault)
    --fail_setups;
    throw comm::CommError(strCat("AIACC_TEST_FAIL_SETUP: rank ", rank, "'s set-up of generation ", g.number, " fails"));
  }
  sync_ptr = make_sync(model.ptr(), trainSettings(cfg, dataset, train->shardSize(), TrainingState{}));
  elastic->publishKeys();
  if (scaler->enabled()) sync_unscales = sync().shareLossScale(scaler->shared());
  const auto grouped = Clock::now();
  *bytes = restoreFromRank0(world_before);
  return grouped;
}

Trainer::State::SetUpVerdict Trainer::State::leaveFailedSetUp(const comm::Generation& g, const std::exception& e,
                                                              bool communication, const comm::WorldInfo& trained_in,
                                                              SetUpRetry& retry) {
  // Only a process that held the state before this generation goes on to the next (a newcomer
  // received none: it ends, and its launcher may start it again as a newcomer). Every such rank
  // decides alike, from the generation alone: it leaves after any failure of the communication,
  // as a failed step does, and after the agreement refused the settings of a newcomer (the running
  // job's are the ones that count). A set-up that failed with no newcomer in it is tried again
  // once (a rank lost during it); after the second such failure in this regroup the ranks stop
  // resumable. (Counted by each rank for the regroup it is in: a rank whose set-up completed
  // while another's failed counts from zero at its next regroup, a rare double failure.)
  constexpr int kRetriesAlone = 1;
  if (!g.isSurvivor(g.rank)) return {};
  std::vector<int> newcomers;
  for (int r = 0; r < g.size(); ++r) {
    if (!g.isSurvivor(r)) newcomers.push_back(r);
  }
  if (newcomers.empty() && !communication) return {};
  const bool stop = newcomers.empty() && ++retry.alone > kRetriesAlone;
  sync_ptr.reset();  // the generation's transports close: every member still waiting in them is released
  // Until the next generation is set up, the state is the one `trained_in` trained (a survivor
  // that stops saves it with that world's settings and shards).
  enterWorld(trained_in);
  if (stop) {
    // The first to claim it saves. A rank behind the generation's newest step (over Gloo a
    // survivor can miss the last step) claims only after kBehindWaits, so that one at the newest
    // step, if it is alive (the lost rank may have been it), saves the newest state.
    constexpr auto kBehindWaits = std::chrono::seconds(1);
    int64_t newest = 0;
    for (const comm::Member& m : g.members) newest = std::max(newest, m.step);
    if (g.members[static_cast<size_t>(g.rank)].step < newest) std::this_thread::sleep_for(kBehindWaits);
    const std::string why = strCat("elastic: the set-up of generation ", g.number,
                                   ", with only ranks that hold the state in it, failed again in this regroup (",
                                   firstLine(e.what()), "; before: ", retry.why, ")");
    const bool writer = claimTheSave();
    LOG(WARNING) << "rank " << rank << " stops after step " << pos.step << ": " << why
                 << (cfg.checkpoint_dir.empty() ? "; nothing is saved (no --checkpoint-dir)"
                     : writer                   ? "; it saves its own state"
                                                : "; another rank saves its state");
    return {false, survivorStop(why, writer)};
  }
  retry.why = firstLine(e.what());
  retry.gone = std::move(newcomers);
  LOG(WARNING) << "elastic: leaving generation " << g.number
               << " before its first step, its set-up failed: " << retry.why;
  return {true, std::nullopt};
}

void Trainer::State::finishChange() {
  if (!run.change_began || report.membership.empty()) return;
  MembershipChange& c = report.membership.back();
  c.first_step_s = secondsOf(Clock::now() - *run.change_began);
  run.change_began.reset();
  if (!isRank0()) return;
  LOG(INFO) << "elastic: first step of generation " << c.generation << " done " << std::fixed << std::setprecision(2)
            << c.first_step_s << " s after the change began";
  writeMetric(membershipJson(c));
}

std::optional<EarlyEnd> Trainer::State::regroupOrStop(const std::string& cause, const std::vector<int>& gone) {
  try {
    if (std::optional<comm::JobEnded> ended = elastic->regroup(pos.step, cause, gone)) {
      return EarlyEnd(std::move(*ended));
    }
    return std::nullopt;
  } catch (const StoreLostError& e) {
    // Nobody to pick one saver: every survivor may save (saveInTurn's note keeps it to one).
    return survivorStop(firstLine(e.what()), /*saver=*/true);
  } catch (const comm::CommError& e) {
    if (e.remedy() != comm::CommError::Remedy::kMembership) throw;
    // Too few came back: the one that claims it first saves what it holds (its own BatchNorm
    // statistics: nobody is left to average them with), and every one stops, resumable.
    return survivorStop(firstLine(e.what()), claimTheSave());
  }
}

bool Trainer::State::claimTheSave() {
  try {
    return elastic->claimSave();
  } catch (const std::exception&) {  // the store is gone: every survivor may save, in turn (saveInTurn)
    return true;
  }
}

std::string Trainer::State::saveOwnState() {
  if (cfg.checkpoint_dir.empty()) return "";
  checkpointWriter().flush();
  takeCheckpointErrors();
  TrainingState p = snapshot();
  p.rank_local_buffers = true;
  checkpoints->submit(pos.step, encodeCheckpoint(*model, *optimizer, p));
  checkpoints->flush();
  return takeCheckpointErrors() ? cfg.checkpoint_dir + "/" + checkpointPayloadName(pos.step) : "";
}

SurvivorStop Trainer::State::stopAfterLostRank(const comm::CommError& e) {
  if (cfg.checkpoint_dir.empty() || !survivor_claim) throw e;
  bool writer = false;
  try {
    writer = survivor_claim();
  } catch (const std::exception&) {  // the store went with the lost rank: nobody can be told apart
    throw e;
  }
  sync_ptr.reset();  // the transports close: a survivor still waiting in them is released
  LOG(WARNING) << "rank " << rank << " stops after step " << pos.step << ": " << firstLine(e.what())
               << (writer ? "; it saves its own state" : "; another surviving rank saves its state");
  return survivorStop(firstLine(e.what()), writer);
}

SurvivorStop Trainer::State::survivorStop(const std::string& why, bool saver) {
  if (cfg.checkpoint_dir.empty()) {
    return SurvivorStop(why, "", "nothing saved (no --checkpoint-dir): the steps this run did are lost", false);
  }
  if (elastic) return saveInTurn(why, saver);
  if (!saver) return SurvivorStop(why, "", "another surviving rank saves its state", true);
  return saveOwnStateOrSay(why);  // (a job of fixed size: its one saver, chosen through the store)
}

SurvivorStop Trainer::State::saveOwnStateOrSay(const std::string& why) {
  std::string saved;
  try {
    saved = saveOwnState();
  } catch (const std::exception& e) {  // (its folder, its memory: the stop goes on, resumable)
    LOG(ERROR) << "rank " << rank << " could not save its state: " << firstLine(e.what());
  }
  if (saved.empty()) return SurvivorStop(why, "", "this rank's checkpoint write failed (the error above)", false);
  return SurvivorStop(why, std::move(saved), "", true);
}

SurvivorStop Trainer::State::saveInTurn(const std::string& why, bool saver) {
  // (A turn lasts one save, seconds; the queue, one per survivor. A holder this long is stuck.)
  constexpr auto kTurnWait = std::chrono::minutes(10);
  try {
    checkpointWriter().flush();  // creates the folder if it is missing; this rank's write in flight ends
  } catch (const std::exception& e) {
    return SurvivorStop(why, "", strCat("nothing saved by this rank: ", firstLine(e.what())), false);
  }
  takeCheckpointErrors();
  std::optional<FileLock> turn;
  try {
    turn.emplace(cfg.checkpoint_dir + "/survivors.lock", kTurnWait);
  } catch (const IoError& e) {  // no locks on that file system, or a holder stuck: a save beats none
    LOG(WARNING) << firstLine(e.what()) << "; going on without a turn";
  }
  // What a survivor of this run of the job saved (its step, then its file): an earlier run's
  // checkpoints, or a `latest` the run resumed before, say nothing of this run's state.
  const std::string note = strCat(cfg.checkpoint_dir, "/survivors-", elastic->runId(), ".saved");
  int64_t step = -1;
  std::string path;
  {
    std::ifstream in(note);
    if (!(in >> step) || !std::getline(in >> std::ws, path)) step = -1;
  }
  if (step >= pos.step) {
    try {  // this rank's own write, ended after that save, may have moved `latest` back
      if (pointLatestAt(cfg.checkpoint_dir, step)) LOG(WARNING) << "latest points at " << path << " again";
    } catch (const IoError& e) {
      LOG(ERROR) << firstLine(e.what());
    }
    LOG(WARNING) << "rank " << rank << " stops after step " << pos.step << ": " << why << "; " << path << " (step "
                 << step << ") is saved already";
    return SurvivorStop(why, "",
                        strCat("step ", step, " is saved already (", path,
                               "); run the job again with --resume auto to continue"),
                        true);
  }
  if (!saver) return SurvivorStop(why, "", "another surviving rank saves its state", true);
  LOG(WARNING) << "rank " << rank << " stops after step " << pos.step << ": " << why << "; it saves its own state";
  SurvivorStop stop = saveOwnStateOrSay(why);
  if (stop.checkpoint().empty()) return stop;
  try {
    writeFileAtomic(note, strCat(pos.step, "\n", stop.checkpoint(), "\n"));
  } catch (const IoError& e) {  // (saved all the same)
    LOG(ERROR) << firstLine(e.what());
  }
  return stop;
}

uint32_t Trainer::State::stateCrc(bool with_momentum) const {
  uint32_t crc = 0;
  const auto add = [&crc](const at::Tensor& t) {
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    crc = crc32c(c.data_ptr(), c.nbytes(), crc);
  };
  for (const at::Tensor& p : params) add(p);
  if (!with_momentum) return crc;
  for (const at::Tensor& m : momentumBuffers(*optimizer)) {
    if (m.defined()) add(m);
  }
  return crc;
}

int64_t Trainer::State::restoreFromRank0(int previous_world) {
  // Who lacks rank 0's model and optimizer state: each rank's slot holds its completed steps + 1
  // (0: a process that was not in the generation before, which holds nothing) and the CRC-32C of
  // its parameters and momentum; summed, all see all. Survivors of a synchronous job at rank 0's
  // step normally hold the same bytes, and then only the position travels (a few KiB, not the
  // model); when any rank is behind, joined or differs, every rank receives everything. (make_sync
  // broadcast rank 0's buffers already, not its weights: a generation with survivors leaves them
  // to this restore. So the weights' equality after a position-only restore rests on this
  // CRC-32C: a rank whose weights differed at the same step, which only a defect can cause, would
  // go unseen with a chance of 2^-32.)
  const comm::Generation& g = elastic->generation();
  const bool survivor = g.isSurvivor(rank);
  if (skew_at_regroup && survivor && !isRank0()) {  // tests: a survivor whose state differs
    torch::NoGradGuard no_grad;
    params.front().add_(1.0);
  }
  at::Tensor held = at::zeros({world, 2}, at::kDouble);
  held[rank][0] = survivor ? static_cast<double>(pos.step + 1) : 0.0;
  held[rank][1] = static_cast<double>(stateCrc(true));
  sync().allreduceSum(held);
  if (!survivor && die_joining == JoinDeath::kRestore) ::raise(SIGKILL);  // (a test's fault)
  bool all_hold = true;
  for (int r = 1; r < world; ++r) {
    all_hold = all_hold && held[r][0].item<double>() == held[0][0].item<double>() &&
               held[r][1].item<double>() == held[0][1].item<double>();
  }
  std::string bytes;
  // The state's size and rank 0's epoch position (where an evaluation pending in it is recorded,
  // and at which stage): doubles, exact for any size below 2^53.
  at::Tensor size = at::zeros({2}, at::kDouble);
  if (isRank0()) {
    // The rest of the epoch goes to the new world: its segment starts after every sample the
    // previous world consumed in its own.
    const Stage& st = stageAt(cfg, static_cast<int>(pos.epochs_done));
    pos.segment_offset += (pos.batches_in_epoch - pos.segment_batch) * globalBatch(st, previous_world);
    pos.segment_batch = pos.batches_in_epoch;
    pos.generation = g.number;
    TrainingState p = snapshot();
    p.comm = pos.comm;  // the communication state the ranks had (regroup kept it; the new sync's is fresh)
    bytes = all_hold ? encodeTrainingState(p) : encodeCheckpoint(*model, *optimizer, p);
    // What the others decide from the state (a pending evaluation) this rank decides from the same:
    // the settings mark a state that carries its evaluation history (evaluationPending).
    pos.settings = p.settings;
    size[0] = static_cast<double>(bytes.size());
    size[1] = run.epoch_pos;
  }
  sync().broadcast(size, 0);
  const auto n = static_cast<int64_t>(size[0].item<double>());
  run.epoch_pos = size[1].item<double>();
  at::Tensor blob = at::empty({n}, at::kByte);
  if (isRank0()) std::memcpy(blob.data_ptr(), bytes.data(), bytes.size());
  sync().broadcast(blob, 0);
  if (!isRank0()) {
    const std::string received(static_cast<const char*>(blob.data_ptr()), n);
    const std::string name = "the training state from rank 0";
    TrainingState restored = all_hold ? decodeTrainingState(received, name)
                                      : decodeCheckpoint(received, name, *model, *optimizer);
    restored.elapsed_s = pos.elapsed_s;  // now() counts from this process's own start
    pos = std::move(restored);
    if (pos.rng_cpu.defined()) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(pos.rng_cpu);
    }
    if (scaler->enabled() && pos.loss_scale > 0) scaler->setState(pos.loss_scale, pos.loss_scale_good_steps);
  }
  if (sample_log) *sample_log << sampleLogPrefix("restore", pos.step) << std::endl;
  // The hashes above already compared every rank's parameters when nothing but the position moved.
  if (!all_hold) checkSameParameters();
  return n;
}

void Trainer::State::checkSameParameters() {
  // Every rank's CRC-32C of its parameters' bytes, in its own slot, summed: all see all.
  at::Tensor all = at::zeros({world}, at::kDouble);
  all[rank] = static_cast<double>(stateCrc(false));
  sync().allreduceSum(all);
  for (int r = 1; r < world; ++r) {
    AIACC_CHECK(all[r].item<double>() == all[0].item<double>(), "elastic: after the regroup to generation ",
                elastic->generation().number, ", rank ", r, "'s parameters differ from rank 0's (CRC-32C ",
                static_cast<uint32_t>(all[r].item<double>()), " against ", static_cast<uint32_t>(all[0].item<double>()),
                ")");
  }
}

void Trainer::State::endOfTraining() {
  at::Tensor here = at::ones({1}, at::kDouble);
  sync().allreduceSum(here);
}

// Each line names the run (its elastic run id: a run resumed from a checkpoint is another) and
// the generation, so that a step is matched with its own restores and its own applied lines.
std::string Trainer::State::sampleLogPrefix(const char* kind, int64_t step) const {
  return strCat(kind, " ", elastic ? elastic->runId() : std::string("-"), " ",
                elastic ? elastic->generation().number : -1, " ", step);
}

void Trainer::State::logSamples(const data::Batch& batch, int64_t step) {
  std::ofstream& out = *sample_log;
  out << sampleLogPrefix("step", step) << " " << pos.epochs_done;
  for (const int64_t s : batch.samples) out << " " << s;
  out << "\n";
  out.flush();
}

void Trainer::State::logApplied() { *sample_log << sampleLogPrefix("applied", pos.step) << std::endl; }

}  // namespace aiacc::app
