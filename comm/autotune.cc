#include "aiacc/comm/autotune.h"

#include <algorithm>
#include <sstream>

#include "aiacc/common/error.h"

namespace aiacc::comm {

std::string TuneConfig::str(bool show_two_level) const {
  std::ostringstream os;
  os << "bucket " << bucket_mb << " MiB, " << channels << (channels == 1 ? " channel" : " channels");
  if (show_two_level) os << ", " << (two_level ? "two-level" : "flat");
  return os.str();
}

Autotuner::Autotuner(TuneConfig start, TuneSpace space) : space_(std::move(space)), best_(start), current_(start) {
  AIACC_CHECK(space_.steps_per_trial >= 2, "autotune: a trial needs at least 2 steps (the first is discarded)");
  nextDimension();
}

double Autotuner::score(const TuneConfig& c) const {
  const auto it = trials_.find(c);
  return it == trials_.end() || it->second.steps.empty() ? 0.0 : it->second.min_s;
}

double Autotuner::exposed(const TuneConfig& c) const {
  const auto it = trials_.find(c);
  return it == trials_.end() || it->second.steps.empty() ? 0.0 : it->second.min_exposed;
}

bool Autotuner::better(const TuneConfig& c, const TuneConfig& ref) const {
  return decide(score(c), score(ref), c, ref);
}

// The confirmation: medians of every counted step of each (both have run two trials by then).
bool Autotuner::confirmed(const TuneConfig& c, const TuneConfig& ref) const {
  auto median = [&](const TuneConfig& x) {
    std::vector<double> v = trials_.at(x).steps;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  return decide(median(c), median(ref), c, ref);
}

double Autotuner::margin() const {
  if (spreads_.empty()) return space_.min_gain;
  std::vector<double> v = spreads_;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return std::max(space_.min_gain, v[v.size() / 2]);
}

// c beats ref at step times sc, sr: faster by more than noise, or within noise with clearly
// less communication exposed.
bool Autotuner::decide(double sc, double sr, const TuneConfig& c, const TuneConfig& ref) const {
  const double m = margin();
  if (sc < sr * (1 - m)) return true;
  if (sc > sr * (1 + m)) return false;
  const double ec = exposed(c), er = exposed(ref);
  return ec < 0.8 * er && er - ec > 0.005;
}

// Candidates of the next dimension that has any not measured yet: the best configuration so far
// with that dimension's value replaced. The best itself comes first when it still needs a score.
void Autotuner::nextDimension() {
  queue_.clear();
  while (queue_.empty() && dimension_ < 3) {
    ++dimension_;
    std::vector<TuneConfig> cands{best_};
    if (dimension_ == 0 && space_.try_two_level) {
      TuneConfig c = best_;
      c.two_level = !c.two_level;
      cands.push_back(c);
    } else if (dimension_ == 1) {
      for (double mb : space_.bucket_mb) {
        TuneConfig c = best_;
        c.bucket_mb = mb;
        cands.push_back(c);
      }
    } else if (dimension_ == 2) {
      for (int k : space_.channels) {
        TuneConfig c = best_;
        c.channels = k;
        cands.push_back(c);
      }
    }
    if (cands.size() == 1 && trials_.count(best_)) continue;  // nothing to compare in this dimension
    for (const auto& c : cands) {
      if (!trials_.count(c) && std::find(queue_.begin(), queue_.end(), c) == queue_.end()) queue_.push_back(c);
    }
  }
  if (queue_.empty()) {
    frozen_ = true;
    current_ = best_;
    return;
  }
  current_ = queue_.front();
  in_trial_ = 0;
}

bool Autotuner::record(double step_s, double exposed_s) {
  if (frozen_) return false;
  ++steps_;
  if (++in_trial_ > 1) {  // the first step of a trial pays for the switch
    Trial& t = trials_[current_];
    const bool first = t.steps.empty();
    t.min_s = first ? step_s : std::min(t.min_s, step_s);
    t.min_exposed = first ? exposed_s : std::min(t.min_exposed, exposed_s);
    t.steps.push_back(step_s);
  }
  if (in_trial_ < space_.steps_per_trial) return false;
  // The trial's spread: its counted steps are the last steps_per_trial - 1 of the configuration's.
  const std::vector<double>& all = trials_[current_].steps;
  const auto counted = static_cast<std::ptrdiff_t>(space_.steps_per_trial - 1);
  if (counted >= 2) {
    const auto [lo, hi] = std::minmax_element(all.end() - counted, all.end());
    if (*lo > 0) spreads_.push_back((*hi - *lo) / *lo);
  }
  const TuneConfig before = current_;
  queue_.erase(queue_.begin());
  if (!queue_.empty()) {
    current_ = queue_.front();
    in_trial_ = 0;
    return current_ != before;
  }
  if (confirming_) {  // both re-timed: the change stands only if it still wins
    confirming_ = false;
    ++confirmations_;
    if (confirmed(challenger_, best_)) {
      best_ = challenger_;
    } else {
      ++overturned_;
    }
    nextDimension();
    return current_ != before;
  }
  // Dimension done: a candidate wins if it beats the best so far by more than noise (or leaves
  // clearly less communication exposed at a step time within noise).
  TuneConfig winner = best_;
  for (const auto& [c, t] : trials_) {
    if (!t.steps.empty() && c != winner && better(c, winner)) winner = c;
  }
  if (winner != best_ && space_.confirm) {
    // Re-time both, the winner first: the best ran first in the dimension's own trials.
    confirming_ = true;
    challenger_ = winner;
    queue_ = {winner, best_};
    current_ = winner;
    in_trial_ = 0;
    return current_ != before;
  }
  best_ = winner;
  nextDimension();
  return current_ != before;
}

void Autotuner::restoreFrozen(const TuneConfig& c) {
  best_ = current_ = c;
  queue_.clear();
  confirming_ = false;
  in_trial_ = 0;
  dimension_ = 3;
  frozen_ = restored_ = true;
}

std::string Autotuner::summary() const {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  const bool two = space_.try_two_level;
  if (restored_) return "restored " + best_.str(two) + " (chosen before; not tuned again)";
  os << (frozen_ ? "chose " : "so far ") << best_.str(two) << " after " << steps_ << " steps";
  os << ", step-time margin " << 100 * margin() << "%";
  if (confirmations_ > 0) {
    os << ", " << confirmations_ << (confirmations_ == 1 ? " change" : " changes") << " re-timed, " << overturned_
       << " overturned";
  }
  bool first = true;
  for (const auto& [c, t] : trials_) {
    if (t.steps.empty()) continue;
    os << (first ? " (" : "; ") << c.str(two) << ": " << 1e3 * t.min_s << " ms/step, " << 1e3 * t.min_exposed
       << " ms exposed";
    first = false;
  }
  if (!first) os << ")";
  return os.str();
}

}  // namespace aiacc::comm
