#include "aiacc/comm/membership.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <tuple>

#include "aiacc/comm/transport.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {
namespace {

// Keys, under the job's prefix. Per generation T: "g<T>/arrivals" (tickets), "g<T>/m<i>" (the
// record of ticket i), "g<T>/survivors" and "g<T>/lost" (counters for the early close),
// "g<T>/lost<r>" (rank r of T-1 reported, once), "g<T>/closed" (the count it closed at),
// "g<T>/roster", "g<T>/gone" (waiters that left without being let in: the job ended, or below MIN
// for too long), "g<T>/failed" (its ranks that ended with an error), "g<T>/beat" (its live
// members' beats), "g<T>/saver" (claimSave, the one election). And "current": the newest closed generation.
constexpr const char* kCurrentKey = "elastic/current";
std::string key(int64_t g, const std::string& what) { return strCat("elastic/g", g, "/", what); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

int64_t newestClosed(c10d::Store& store) {  // Membership::current()
  return store.check({kCurrentKey}) ? std::stoll(text(store.get(kCurrentKey))) : -1;
}

}  // namespace

void markJobEnded(c10d::Store& store, JobEnd how) {
  if (how == JobEnd::kStopped) {  // over anything: a survivor saved the state
    store.set("elastic/ended", bytes("stopped"));
  } else {  // never over a stop: a survivor still waiting must still learn that its state is wanted
    store.compareSet("elastic/ended", {}, bytes(how == JobEnd::kStoppedUnsaved ? "stopped-unsaved" : "finished"));
  }
}
bool jobEnded(c10d::Store& store) { return store.check({"elastic/ended"}); }
bool waitersRemain(c10d::Store& store) {
  int64_t open = newestClosed(store) + 1;
  while (store.check({key(open, "closed")})) ++open;  // (closed, "current" not yet moved on)
  if (!store.check({key(open, "arrivals")})) return false;
  auto count = [&](const char* what) { return store.check({key(open, what)}) ? store.add(key(open, what), 0) : 0; };
  const int64_t gone = count("gone");  // (before the arrivals: one that arrives and leaves between still counts)
  if (store.add(key(open, "arrivals"), 0) > gone) return true;
  // Once a regroup began (a survivor came, or a loss was reported): a rank of the last generation
  // that has not arrived yet (slow to see the failure), unless reported lost. It will, and must
  // find the store. (A newcomer alone begins no regroup: the last generation may have finished.)
  const int64_t accounted = count("survivors") + count("lost");
  const std::string last_size = key(open - 1, "closed");
  return accounted > 0 && open > 0 && store.check({last_size}) && accounted < std::stoll(text(store.get(last_size)));
}
JobEnd jobEndedHow(c10d::Store& store) {
  const std::string how = text(store.get("elastic/ended"));
  if (how == "stopped") return JobEnd::kStopped;
  if (how == "stopped-unsaved") return JobEnd::kStoppedUnsaved;
  return how == "failed" ? JobEnd::kFailed : JobEnd::kFinished;
}
void beat(c10d::Store& store, int64_t generation) { store.add(key(generation, "beat"), 1); }

void markJobFailed(c10d::Store& store, int64_t generation, int size) {
  if (store.add(key(generation, "failed"), 1) >= size) store.compareSet("elastic/ended", {}, bytes("failed"));
}

std::string encodeMember(const Member& m) {
  AIACC_CHECK(m.node.find_first_of(" \t\n") == std::string::npos, "a member's node has no spaces: '", m.node, "'");
  return strCat(m.generation, " ", m.rank, " ", m.step, " ", m.node.empty() ? "-" : m.node);
}

Member decodeMember(const std::string& s) {
  std::istringstream in(s);
  Member m;
  AIACC_CHECK(static_cast<bool>(in >> m.generation >> m.rank >> m.step >> m.node), "bad member record '", s, "'");
  if (m.node == "-") m.node.clear();
  return m;
}

WorldInfo Generation::world() const {
  AIACC_CHECK(rank >= 0 && rank < size(), "not a member of generation ", number);
  WorldInfo w;
  w.rank = rank;
  w.world = size();
  w.local_rank = 0;
  w.local_size = 0;
  for (int r = 0; r < size(); ++r) {
    if (members[static_cast<size_t>(r)].node != members[static_cast<size_t>(rank)].node) continue;
    if (r < rank) ++w.local_rank;
    ++w.local_size;
  }
  return w;
}

bool Generation::isSurvivor(int r) const {
  const int64_t from = members.at(static_cast<size_t>(r)).generation;
  return number > 0 && from == number - 1;
}

int Generation::survivors() const {
  int n = 0;
  for (int r = 0; r < size(); ++r) n += isSurvivor(r);
  return n;
}

std::vector<int> Generation::lostFrom(int previous_world) const {
  std::vector<int> lost;
  for (int r = 0; r < previous_world; ++r) {
    const bool here = std::any_of(members.begin(), members.end(), [&](const Member& m) {
      return number > 0 && m.generation == number - 1 && m.rank == r;
    });
    if (!here) lost.push_back(r);
  }
  return lost;
}

Membership::Membership(c10::intrusive_ptr<c10d::Store> store, MembershipOptions options)
    : store_(std::move(store)), o_(std::move(options)) {
  if (!o_.clock) o_.clock = steadyClock();
  AIACC_CHECK_INPUT(o_.min >= 1 && o_.max >= o_.min, "elastic range ", o_.min, ":", o_.max,
                    " is not MIN:MAX with 1 <= MIN <= MAX");
}

int64_t Membership::current() { return newestClosed(*store_); }

bool Membership::joinersWaiting(const Generation& current) {
  return store_->check({key(current.number + 1, "arrivals")});
}

Membership::Joined Membership::join(const Member& self, const std::vector<int>& lost, int previous_world) {
  // A survivor goes to the generation after its own; a process late by more (stopped for a
  // while) or new goes to the one after the newest closed.
  tried_as_survivor_ = false;  // (until a try below says otherwise)
  left_out_ = false;
  int64_t number = std::max(self.generation + 1, current() + 1);
  for (;; ++number) {  // closed without this process: the next one lets it in
    left_out_ = self.generation >= 0 && number > self.generation + 1;
    if (std::optional<Joined> out = tryJoin(number, self, self.generation == number - 1 ? lost : std::vector<int>{},
                                            previous_world)) {
      return *std::move(out);
    }
  }
}

std::optional<Membership::Joined> Membership::tryJoin(int64_t number, const Member& self, const std::vector<int>& lost,
                                                      int previous_world) {
  if (store_->check({key(number, "closed")})) return std::nullopt;
  const int64_t ticket = store_->add(key(number, "arrivals"), 1) - 1;
  store_->set(key(number, strCat("m", ticket)), bytes(encodeMember(self)));
  const bool survivor = self.generation == number - 1 && self.generation >= 0;
  tried_as_survivor_ = survivor;
  if (survivor) store_->add(key(number, "survivors"), 1);
  for (const int r : lost) {  // each lost rank counted once, whoever reports it first
    if (store_->add(key(number, strCat("lost", r)), 1) == 1) store_->add(key(number, "lost"), 1);
  }
  const Clock::time_point start = o_.clock->now();
  std::optional<Clock::time_point> min_seen;
  int closed_at = -1;
  // A process that holds no state of generation number - 1 (a newcomer, or one late by more)
  // watches that generation's beat: while it moves, its members are alive and will come.
  const bool watch_beat = !survivor && number > 0;
  if (watch_beat && o_.waiting_to_join) o_.waiting_to_join(number);
  int64_t beats = -1;
  auto beat_moved = start;
  // (Read twice per beat, and four times per beat_stale, not at every poll.)
  const Clock::duration beat_read_every = std::min<Clock::duration>(kBeatInterval / 2, o_.beat_stale / 4);
  std::optional<Clock::time_point> beat_read;
  // A waiter that leaves without being let in says so, so that a launcher serving the store
  // after the job's end knows when nobody is left to read it (waitersRemain).
  auto leave = [&] {
    try {
      store_->add(key(number, "gone"), 1);
    } catch (const std::exception&) {  // (the store is gone: nobody is left to tell)
    }
  };
  while (closed_at < 0) {
    if (store_->check({key(number, "closed")})) {
      closed_at = std::stoi(text(store_->get(key(number, "closed"))));
      break;
    }
    const int arrived = static_cast<int>(store_->add(key(number, "arrivals"), 0));
    const Clock::time_point now = o_.clock->now();
    // At MIN or above, newcomers with no survivor among them yet (they close only once the beat
    // stops, below). (Read at MIN only: below it nobody closes, and the read makes the key.)
    const bool newcomers_only = watch_beat && arrived >= o_.min && store_->add(key(number, "survivors"), 0) == 0;
    // (Only below MIN, or among newcomers only: else the generation forms whatever the mark
    // says. A process that left on the mark keeps its ticket in the arrivals, and a close at MIN
    // would take it into the roster. Newcomers alone after the end would begin the job again.)
    if ((arrived < o_.min || newcomers_only) && jobEnded(*store_)) {
      const JobEnd how = jobEndedHow(*store_);
      // Survivors below MIN each wait out their own timeout: the first to give up ends the job
      // before the others' run out. They stop as it did (resumable), not as a finished job's
      // stragglers, and the first of them to claim it saves what it holds (claimSave).
      if (survivor && (how == JobEnd::kStopped || how == JobEnd::kStoppedUnsaved)) {
        leave();
        throw CommError(strCat("elastic: only ", arrived, " of at least ", o_.min, " processes arrived for generation ",
                               number,
                               ", and another surviving process stopped the job meanwhile; the job cannot go "
                               "on with fewer"),
                        CommError::Remedy::kMembership);
      }
      leave();
      if (how == JobEnd::kFailed) {
        return JobEnded{how, strCat("elastic: every rank of the job failed (their logs say why) while this process "
                                    "waited to join generation ",
                                    number)};
      }
      return JobEnded{how, strCat("elastic: the job ", how == JobEnd::kFinished ? "finished" : "stopped",
                                  " while this process waited to join generation ", number)};
    }
    if (arrived >= o_.max) {
      closed_at = close(number, o_.max);
      break;
    }
    if (arrived >= o_.min) {
      if (!min_seen) min_seen = now;
      const bool all_accounted = survivor && previous_world > 0 &&
                                 store_->add(key(number, "survivors"), 0) + store_->add(key(number, "lost"), 0) >=
                                     previous_world;
      bool may_close = true;  // by the last call
      if (newcomers_only) {
        if (!beat_read || now - *beat_read >= beat_read_every) {
          beat_read = now;
          const int64_t b = store_->add(key(number - 1, "beat"), 0);
          if (b != beats) beats = b, beat_moved = now;
        }
        may_close = now - beat_moved >= o_.beat_stale;
        // (The last call runs from when a survivor came, or the beat stopped: not from this
        // newcomer's own arrival, or the first survivor would close it without the others.)
        if (!may_close) min_seen = now;
        if (!may_close && now - start >= o_.timeout) {
          leave();
          throw CommError(strCat("elastic: generation ", number - 1,
                                 " is alive but did not let this process in within ",
                                 std::chrono::duration<double>(o_.timeout).count(),
                                 " s (its rank 0 looks for newcomers at each step boundary: is the job stuck?)"),
                          CommError::Remedy::kMembership);
        }
      }
      if (all_accounted || (may_close && now - *min_seen >= o_.last_call)) {
        closed_at = close(number, arrived);
        break;
      }
    } else if (now - start >= o_.timeout) {
      leave();
      throw CommError(strCat("elastic: only ", arrived, " of at least ", o_.min, " processes arrived for generation ",
                             number, " within ", std::chrono::duration<double>(o_.timeout).count(),
                             " s; the job cannot go on with fewer"),
                      CommError::Remedy::kMembership);
    }
    o_.clock->sleepFor(o_.poll);
  }
  if (ticket >= closed_at) return std::nullopt;
  // The roster: written by the closer once every record it covers is readable.
  const std::string roster_key = key(number, "roster");
  const Clock::time_point deadline = o_.clock->now() + o_.timeout;
  while (!store_->check({roster_key})) {
    if (o_.clock->now() >= deadline) {
      throw CommError(strCat("elastic: generation ", number, " closed at ", closed_at,
                             " processes but its roster never came (the process that closed it died?)"),
                      CommError::Remedy::kMembership);
    }
    o_.clock->sleepFor(o_.poll);
  }
  std::istringstream in(text(store_->get(roster_key)));
  Generation out;
  out.number = number;
  out.arrivals = closed_at;
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    AIACC_CHECK(space != std::string::npos, "bad roster line '", line, "'");
    if (std::stoll(line.substr(0, space)) == ticket) out.rank = out.size();
    out.members.push_back(decodeMember(line.substr(space + 1)));
  }
  AIACC_CHECK(out.rank >= 0, "ticket ", ticket, " missing from the roster of generation ", number);
  return out;
}

bool claimSave(c10d::Store& store, int64_t generation) { return store.add(key(generation, "saver"), 1) == 1; }

int Membership::close(int64_t number, int count) {
  const std::string mine = std::to_string(count);
  const std::string agreed = text(store_->compareSet(key(number, "closed"), {}, bytes(mine)));
  // Whoever set the count writes the roster (two closers at the same count write the same one).
  if (agreed == mine) writeRoster(number, count);
  return std::stoi(agreed);
}

void Membership::writeRoster(int64_t number, int count) {
  struct Entry {
    int64_t ticket;
    Member m;
  };
  std::vector<Entry> entries;
  for (int64_t i = 0; i < count; ++i) {  // a ticket's record follows it at once: get waits for it
    entries.push_back({i, decodeMember(text(store_->get(key(number, strCat("m", i)))))});
  }
  // Survivors first, the most advanced first; then newcomers in arrival order.
  std::stable_sort(entries.begin(), entries.end(), [&](const Entry& a, const Entry& b) {
    const bool sa = number > 0 && a.m.generation == number - 1, sb = number > 0 && b.m.generation == number - 1;
    if (sa != sb) return sa;
    if (!sa) return std::tie(a.m.rank, a.ticket) < std::tie(b.m.rank, b.ticket);  // a launcher's rank, if any
    if (a.m.step != b.m.step) return a.m.step > b.m.step;
    return a.m.rank < b.m.rank;
  });
  std::string roster;
  for (const Entry& e : entries) roster += strCat(e.ticket, " ", encodeMember(e.m), "\n");
  store_->set(key(number, "roster"), bytes(roster));
  store_->set(kCurrentKey, bytes(std::to_string(number)));
  // Two generations back: nobody reads those keys any more (one back, a late process may still
  // be reading that it closed).
  if (number >= 2) deleteGeneration(number - 2);
}

void Membership::deleteGeneration(int64_t number) {
  const std::string arrivals = key(number, "arrivals");
  if (!store_->check({arrivals})) return;
  const int64_t tickets = store_->add(arrivals, 0);
  for (int64_t i = 0; i < tickets; ++i) store_->deleteKey(key(number, strCat("m", i)));
  // lost<r>: r a rank of the generation before, whose world was at most MAX.
  for (int r = 0; r < o_.max; ++r) store_->deleteKey(key(number, strCat("lost", r)));
  for (const char* k : {"survivors", "lost", "closed", "roster", "gone", "failed", "beat", "saver"}) {
    store_->deleteKey(key(number, k));
  }
  store_->deleteKey(arrivals);
}

}  // namespace aiacc::comm
