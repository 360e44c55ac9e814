// Autotuner: picks fusion size, channel count and two-level reduction during the first steps of
// training, from step times that every rank measured and averaged with one allreduce (so every
// rank holds the same numbers and reaches the same decision; no coordinator).
//
// Search: one dimension at a time (two-level first: it matters most between nodes; then fusion
// size; then channels), each candidate tried for `steps_per_trial` steps, the first of which is
// discarded (it pays for the switch: new buffers, a cold plan). A trial's score is the fastest of
// its counted steps (interference only ever slows a step down, so the minimum is the least noisy
// estimate). A candidate replaces the current value when its step time is lower by more than
// the noise margin, or when its step time is within that margin and the communication it leaves
// exposed after backward is clearly lower (by a fifth, and 5 ms) — exposed time is the direct
// measure of what is being tuned and far less noisy than a step on a busy machine. The noise
// margin is `min_gain` or the machine's own step-to-step spread, whichever is larger: the median,
// over the trials so far, of (slowest - fastest) / fastest of a trial's counted steps (a busy host
// with ranks sharing cores varies 10% from step to step; a difference smaller than that is
// not a measurement, so exposed communication decides). So the tuner
// never settles on a configuration slower than the default by more than noise. A configuration
// measured once is not measured again, except to confirm a change: before the winner of a
// dimension replaces the current best, both run one more trial, in the reverse of the order they
// were first measured (so a machine that speeds up or slows down during the search favours
// neither), and the change stands only if it still wins on the median of all its counted steps
// (with the same margin and tie-break). One lucky step can no longer make the choice. TuneSpace
// tries nothing by default (the program names the candidates); with aiacc_train's space (two-level
// on and off, 4 fusion caps, 3 channel counts: 2 x 4 x 3 candidates, 3 steps each) it is frozen
// after at most 39 steps (21 without confirmation).
//
// Pure logic: DataParallel feeds it measurements and applies what it returns.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "aiacc/comm/options.h"

namespace aiacc::comm {

class Autotuner {
 public:
  Autotuner(TuneConfig start, TuneSpace space);

  // The configuration to run now.
  const TuneConfig& current() const { return current_; }
  bool frozen() const { return frozen_; }
  int stepsRecorded() const { return steps_; }
  // Records the step just run under current() (rank-averaged seconds: whole step, and
  // communication exposed after backward). Returns true when current() changed.
  bool record(double step_s, double exposed_s);
  // A choice made before (a checkpoint's, CommState): frozen at `c` from now on, measuring nothing.
  void restoreFrozen(const TuneConfig& c);
  // What was measured and decided, one line.
  std::string summary() const;
  // Fastest counted step of a configuration, and its least exposed communication (0 when never
  // measured).
  double score(const TuneConfig& c) const;
  double exposed(const TuneConfig& c) const;
  // The step-time margin in use: max(min_gain, median spread of the trials so far).
  double margin() const;

 private:
  struct Trial {
    double min_s = 0, min_exposed = 0;
    std::vector<double> steps;  // every counted step time (the confirmation's median)
  };
  bool better(const TuneConfig& c, const TuneConfig& ref) const;
  bool confirmed(const TuneConfig& c, const TuneConfig& ref) const;
  bool decide(double sc, double sr, const TuneConfig& c, const TuneConfig& ref) const;
  void nextDimension();
  void startTrial();

  TuneSpace space_;
  TuneConfig best_;  // best so far (the reference a candidate must beat)
  TuneConfig current_;
  std::vector<TuneConfig> queue_;  // candidates of the current dimension still to measure
  int dimension_ = -1;             // 0: two-level, 1: fusion, 2: channels, 3: done
  int in_trial_ = 0;               // steps run of the current trial
  std::map<TuneConfig, Trial> trials_;
  bool frozen_ = false;
  bool restored_ = false;    // frozen by restoreFrozen, not by measurement
  bool confirming_ = false;  // the queue holds the confirmation of challenger_ against best_
  TuneConfig challenger_;
  int confirmations_ = 0, overturned_ = 0;
  std::vector<double> spreads_;  // per finished trial: (max - min) / min of its counted steps
  int steps_ = 0;
};

}  // namespace aiacc::comm
