// Trainer::State's records of training: the --metrics-file lines (every --log-every steps, with the
// job's numbers summed over the ranks), the same points in TensorBoard (--tensorboard-dir), and
// rank 0's progress line (every --progress-seconds).
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <utility>

#include "app/trainer_state.h"
#include "aiacc/common/error.h"
#include "aiacc/common/json.h"

namespace aiacc::app {

void Trainer::State::writeMetric(const std::string& json) {
  if (metrics.is_open()) metrics << json << std::endl;  // whole lines, as they happen (tail -f)
}

void Trainer::State::flushLog() {
  if (run.window.steps == 0) return;
  at::Tensor sums = at::tensor({run.window.loss_sum, static_cast<double>(run.window.images)}, at::kDouble);
  // The window is emptied only once its sums are in: a failure here (a lost rank) leaves its steps
  // for the regroup to count.
  sync().allreduceSum(sums);
  const LogWindow w = std::exchange(run.window, LogWindow{});
  const double loss_sum = sums[0].item<double>();
  const auto images = static_cast<int64_t>(std::llround(sums[1].item<double>()));
  // A rank's non-finite loss makes the job's non-finite (null in the line): the run diverged.
  run.job_loss = images > 0 ? loss_sum / static_cast<double>(images) : std::nan("");
  pos.images_seen += images;
  run.job_images += images;
  run.job_images_train_s = run.train_s;
  pos.epoch_loss_sum += loss_sum;
  pos.epoch_images += images;
  pos.epoch_lr = w.lr;
  const double ips = static_cast<double>(images) / std::max(1e-9, w.wall_s);
  const double steps = static_cast<double>(w.steps);
  // Rank 0's wait for gradients after backward, per step of the window.
  const double exposed = sync().exposedCommSeconds();
  const double exposed_per_step = (exposed - std::exchange(run.logged_exposed_comm_s, exposed)) / steps;
  writeMetric(toJsonLine(Json{{"type", "step"},
                              {"step", pos.step},
                              {"epoch", w.epoch},
                              {"batch", w.batch},
                              {"loss", run.job_loss},
                              {"lr", w.lr},
                              {"steps", w.steps},
                              {"images", images},
                              {"images_per_s", ips},
                              {"compute_s", w.compute_s / steps},
                              {"exposed_comm_s", exposed_per_step},
                              {"skipped_steps", pos.skipped_steps}}));
  tensorboardScalars({{"train/loss", run.job_loss},
                      {"train/lr", w.lr},
                      {"train/images_per_s", ips},
                      {"train/exposed_comm_s", exposed_per_step},
                      {"train/skipped_steps", static_cast<double>(pos.skipped_steps)}});
}

void Trainer::State::tensorboardScalars(const std::vector<std::pair<std::string, double>>& points) {
  if (!tensorboard) return;
  try {
    const double t = TensorBoardWriter::now();
    for (const auto& [tag, value] : points) tensorboard->scalar(tag, value, pos.step, t);
    tensorboard->flush();  // visible to a TensorBoard watching the folder as it happens
  } catch (const IoError& e) {
    LOG(ERROR) << "--tensorboard-dir: " << e.what() << "; no more TensorBoard points in this run "
               << "(training, the metrics file and checkpoints go on)";
    tensorboard.reset();
  }
}

void Trainer::State::tensorboardConfig() {
  if (!tensorboard) return;
  // A Markdown table of every flag's value (the same list a checkpoint's config holds).
  std::string md = "| flag | value |\n|---|---|\n";
  for (const auto& [flag, value] : cfg.resolved_flags) {
    std::string v;
    for (char ch : value) v += ch == '|' ? std::string("\\|") : std::string(1, ch);
    std::string name = flag;
    std::replace(name.begin(), name.end(), '_', '-');
    md += "| --" + name + " | " + v + " |\n";
  }
  try {
    tensorboard->text("config", md, pos.step, TensorBoardWriter::now());
    tensorboard->flush();
  } catch (const IoError& e) {
    LOG(ERROR) << "--tensorboard-dir: " << e.what() << "; no TensorBoard output in this run";
    tensorboard.reset();
  }
}

void Trainer::State::printProgress(int epoch, int64_t step_in_epoch, int64_t batches, const Stage& st, double loss,
                                   double lr, Clock::time_point t) {
  if (!isRank0() || std::chrono::duration<double>(t - run.last_progress).count() < cfg.progress_seconds) return;
  run.last_progress = t;
  // The job's images (summed over the ranks at each metrics line) over the training time up to it.
  const double mean_ips = static_cast<double>(run.job_images) / std::max(1e-9, run.job_images_train_s);
  const int64_t left = std::max<int64_t>(0, run.planned - pos.step);
  const double eta = static_cast<double>(left) * run.train_s / std::max<int64_t>(1, run.steps);
  std::cout << "epoch " << epoch + 1 << "/" << cfg.epochs << " step " << step_in_epoch << "/" << batches << " size "
            << st.image_size << std::fixed << std::setprecision(4);
  if (run.job_images > 0) {  // the job's numbers come with the first metrics line (--log-every)
    std::cout << " loss " << loss << " lr " << lr << std::setprecision(1) << " img/s " << mean_ips;
  } else {
    std::cout << " loss - lr " << lr << " img/s -";
  }
  std::cout << " ETA " << formatDuration(eta) << std::endl;
}

}  // namespace aiacc::app
