// End to end: the trainer learns the generated sample, reports, checkpoints and resumes; the
// aiacc_train binary fails cleanly on bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include <torch/cuda.h>

#include "app/trainer.h"
#include "aiacc/common/checkpoint_dir.h"
#include "tests/comm_test_util.h"  // AIACC_SKIP_WITHOUT_GLOO
#include "tests/json_util.h"
#include "tests/test_util.h"
#include "tests/train_problem.h"

namespace aiacc::app {
namespace {

class TrainE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    test::makeLearnableSample(*dir_ / "ds");
  }
  static void TearDownTestSuite() { delete dir_; }
  static Config smallConfig() { return test::learnableConfig(*dir_ / "ds"); }
  static test::TempDir* dir_;
};
test::TempDir* TrainE2E::dir_ = nullptr;

TEST_F(TrainE2E, LearnsWellAboveChanceAndReports) {
  Config c = smallConfig();
  c.metrics_file = *dir_ / "metrics.jsonl";
  c.target_top1 = 100.1;  // not reachable: the run goes all 3 epochs
  Report r = Trainer(c, {}, localSync(), Trainer::Clock::now()).run();
  EXPECT_EQ(r.evals.size(), 3u);
  EXPECT_EQ(r.steps, 3 * (320 / 16));
  EXPECT_EQ(r.images_seen, 3 * 320);
  EXPECT_FALSE(r.target_reached);
  EXPECT_GT(r.final_top1, 60.0) << "chance is 12.5%";
  EXPECT_GT(r.evals.back().top1, r.evals.front().top1) << "accuracy improves";
  EXPECT_EQ(r.evals.back().images, 80);
  EXPECT_EQ(r.skipped_files, 0);
  EXPECT_GT(r.mean_images_per_s, 0);
  EXPECT_EQ(test::jsonLines(c.metrics_file, "step").size(), 60u);
  EXPECT_EQ(test::jsonLines(c.metrics_file, "eval").size(), 3u);
  const Json json = Json::parse(reportJson(r, c));
  EXPECT_TRUE(json.at("time_to_target_s").is_null());
  EXPECT_EQ(json.at("final_top1").get<double>(), r.final_top1) << "doubles round-trip";
  EXPECT_EQ(json.at("evals").size(), 3u);
}

// AIACC_BENCH_STEP_VOTE_AB=2 (scripts/bench_preempt.sh's step-by-step comparison): the ranks vote
// after steps 1, 2, 5, 6, 9, 10, and the steady steps (from the 4th) are split by whether a vote
// came before them: 6, 7, 10, 11 after one; 4, 5, 8, 9, 12 after none.
TEST_F(TrainE2E, StepVoteAbSplitsTheSteadyStepsByTheVoteBeforeThem) {
  Config c = smallConfig();
  c.max_steps = 12;
  Trainer t(c, {}, localSync(), Trainer::Clock::now());
  TestHooks hooks;
  hooks.step_vote_ab = 2;
  t.setTestHooks(hooks);
  const Report r = t.run();
  EXPECT_EQ(r.steps, 12);
  EXPECT_EQ(r.vote_ab.block, 2);
  EXPECT_EQ(r.vote_ab.steps_with, 4);
  EXPECT_EQ(r.vote_ab.steps_without, 5);
  EXPECT_GT(r.vote_ab.s_with, 0);
  EXPECT_GT(r.vote_ab.s_without, 0);
  const Json ab = Json::parse(reportJson(r, c)).at("step_vote_ab");
  EXPECT_EQ(ab.at("steps_with").get<int64_t>(), 4);
  EXPECT_NEAR(ab.at("with_over_without").get<double>(), (r.vote_ab.s_with / 4) / (r.vote_ab.s_without / 5), 1e-12);
  EXPECT_FALSE(
      Json::parse(reportJson(Trainer(c, {}, localSync(), Trainer::Clock::now()).run(), c)).contains("step_vote_ab"))
      << "only when asked for";
  // A stop request from step 3 on (a step without a vote) is agreed at the next vote, after step 5
  // (alone, a vote answers at once).
  Trainer stopped(c, {}, localSync(), Trainer::Clock::now());
  stopped.setTestHooks(hooks);
  int polls = 0;
  stopped.setStopRequest([&] { return ++polls >= 3 ? SIGTERM : 0; });
  const Report s = stopped.run();
  EXPECT_TRUE(s.preempted);
  EXPECT_EQ(s.steps, 5);
}

// --amp on the CPU: autocast in bf16 (no loss scaling needed), fp32 master weights. Its losses
// track the fp32 run's, and the bf16 computation is deterministic: run twice in one process
// (after an fp32 run, as a user's program might), it gives the same loss at every step.
TEST_F(TrainE2E, MixedPrecisionTracksFp32) {
  std::vector<std::vector<double>> losses;
  int run = 0;
  for (bool amp : {false, true, true}) {
    Config c = smallConfig();
    c.stages = {Stage{0, 16, 8, 0.35}};
    c.max_steps = 8;
    c.amp = amp;
    c.amp_dtype = AmpDtype::kBf16;
    c.metrics_file = *dir_ / ("precision-" + std::to_string(run++) + ".jsonl");
    Report r = Trainer(c, {}, localSync(), Trainer::Clock::now()).run();
    EXPECT_EQ(r.precision, amp ? "amp bf16" : "fp32");
    EXPECT_EQ(r.device, "cpu");
    EXPECT_EQ(r.loss_scale, 0) << "bf16 needs no loss scaling";
    EXPECT_EQ(r.steps, 8);
    EXPECT_TRUE(std::isfinite(r.evals.back().loss)) << "eval loss of run " << run;
    losses.push_back(test::metricValues(c.metrics_file, "step", "loss"));
    if (amp) {
      EXPECT_EQ(Json::parse(reportJson(r, c)).at("precision"), "amp bf16");
    }
  }
  for (const auto& l : losses) ASSERT_EQ(l.size(), 8u);
  EXPECT_EQ(losses[1], losses[2]) << "the same bf16 run twice: the same loss at every step";
  // Step 1 has the same weights and batch: only the arithmetic differs (bf16 keeps ~3 digits).
  // Later steps drift apart by the usual run-to-run amount; their mean stays close.
  EXPECT_NEAR(losses[1][0], losses[0][0], 0.02);
  double mean0 = 0, mean1 = 0;
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isfinite(losses[1][i]));
    mean0 += losses[0][i] / 8;
    mean1 += losses[1][i] / 8;
  }
  EXPECT_NEAR(mean1, mean0, 0.08);
  std::cout << "loss at step 1: fp32 " << losses[0][0] << ", amp bf16 " << losses[1][0] << "; mean of 8 steps: fp32 "
            << mean0 << ", amp bf16 " << mean1 << "\n";
  EXPECT_NE(losses[0], losses[1]) << "autocast changed the arithmetic";
}

TEST_F(TrainE2E, StopsAtTargetAndTimesIt) {
  Config c = smallConfig();
  c.target_top5 = 90;  // reached before the end
  c.eval_every = 10;
  Report r = Trainer(c, {}, localSync(), Trainer::Clock::now()).run();
  ASSERT_TRUE(r.target_reached);
  EXPECT_GE(r.evals.back().top5, 90);
  EXPECT_DOUBLE_EQ(r.time_to_target_s, r.evals.back().seconds);
  EXPECT_LT(r.steps, 60) << "stopped before the end";
  EXPECT_EQ(r.steps % 10, 0);
}

TEST_F(TrainE2E, ResumeContinuesExactlyWhereItStopped) {
  test::TempDir ck;
  Config straight = smallConfig();
  straight.epochs = 2;
  straight.stages = {Stage{0, 24, 16, 0.35}};
  Report full = Trainer(straight, {}, localSync(), Trainer::Clock::now()).run();

  Config first = straight;
  first.checkpoint_dir = ck.path();
  first.max_steps = 20;  // exactly one epoch
  Report half = Trainer(first, {}, localSync(), Trainer::Clock::now()).run();
  ASSERT_EQ(half.steps, 20);
  Config second = straight;
  second.resume = ck / "step-000000000020.ckpt";  // --resume PATH: that file, strictly
  Report rest = Trainer(second, {}, localSync(), Trainer::Clock::now()).run();
  EXPECT_EQ(rest.steps, 40);
  EXPECT_EQ(rest.images_seen, full.images_seen);
  ASSERT_EQ(rest.evals.size(), 2u) << "epoch 1's evaluation (the checkpoint carries the history), and epoch 2's";
  EXPECT_EQ(rest.evals.front().loss, half.evals.back().loss);
  EXPECT_NEAR(rest.evals.back().loss, full.evals.back().loss, 1e-4);
  EXPECT_DOUBLE_EQ(rest.final_top1, full.final_top1);
}

const auto runCommand = test::runShell;

// Runs aiacc_train with arguments; returns exit code and stderr+stdout.
using test::runTrain;

// --evaluate: the val split once with a saved model reproduces the training run's final
// evaluation exactly, from its last checkpoint (--resume) and from --save-weights X.pt
// (--init-weights); no step is trained.
TEST_F(TrainE2E, EvaluateReproducesTheFinalEvaluation) {
  test::TempDir d;
  Config c = smallConfig();
  c.epochs = 1;
  c.checkpoint_dir = d / "ck";
  c.save_weights = d / "w.pt";
  const Report trained = Trainer(c, {}, localSync(), Trainer::Clock::now()).run();
  ASSERT_FALSE(trained.evals.empty());
  const EvalPoint& want = trained.evals.back();
  ASSERT_EQ(want.step, trained.steps);
  for (bool from_checkpoint : {true, false}) {
    Config e = smallConfig();
    e.evaluate_only = true;
    e.lr = 0.01;  // an evaluation continues no training: other training settings are no error
    (from_checkpoint
         ? e.resume
         : e.init_weights) = from_checkpoint
                                 ? d / ("ck/step-" + std::string(12 - std::to_string(trained.steps).size(), '0') +
                                        std::to_string(trained.steps) + ".ckpt")
                                 : d / "w.pt";
    const Report r = Trainer(e, {}, localSync(), Trainer::Clock::now()).run();
    const std::string source = from_checkpoint ? "--resume" : "--init-weights";
    ASSERT_FALSE(r.evals.empty()) << source;
    const EvalPoint& got = r.evals.back();
    EXPECT_EQ(got.top1, want.top1) << source;
    EXPECT_EQ(got.top5, want.top5) << source;
    EXPECT_EQ(got.loss, want.loss) << source;
    EXPECT_EQ(got.images, want.images) << source;
    EXPECT_EQ(r.final_top1, want.top1) << source;
    EXPECT_EQ(r.steps, from_checkpoint ? trained.steps : 0) << source << ": no step trained";
    EXPECT_EQ(r.images_seen, from_checkpoint ? trained.images_seen : 0) << source;
  }
  // Two ranks, each evaluating its half of val/: the same counts; the loss agrees to float32
  // rounding (each batch's loss is a float32 sum, and two ranks batch the images differently:
  // 16+16+8 each instead of 5 x 16).
  const auto [rc, out] = runTrain(
      strCat("--nproc 2 --master 127.0.0.1:", test::freePort(), " --data ", *dir_ / "ds",
             " --arch resnet18 --image-size 32 --batch-size 16 --threads 1 --workers 1 --evaluate --init-weights ",
             d / "w.pt", " --metrics-file ", d / "two.jsonl"));
  ASSERT_EQ(rc, 0) << out;
  ASSERT_EQ(test::metricValues(d / "two.jsonl", "eval", "top1"), std::vector<double>{want.top1}) << out;
  EXPECT_EQ(test::metricValues(d / "two.jsonl", "eval", "top5"), std::vector<double>{want.top5});
  EXPECT_NEAR(test::metricValues(d / "two.jsonl", "eval", "loss").at(0), want.loss, 1e-6 * std::abs(want.loss));
  EXPECT_EQ(test::metricValues(d / "two.jsonl", "eval", "images"), std::vector<double>{80});
  EXPECT_NE(out.find("final accuracy"), std::string::npos) << out;
}

// --amp on a CPU whose oneDNN has no bf16 convolution (oneDNN held to AVX2 here, as on a CPU
// without AVX-512): one line saying so before anything trains, not oneDNN's "could not create a
// primitive descriptor iterator" from inside step 1.
TEST(Cli, AmpWithoutBf16KernelsIsOneLineBeforeTraining) {
  const auto [rc, out] = runCommand("ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 " + std::string(AIACC_TRAIN_BIN) +
                                    " --data synthetic --synthetic-images 16 --synthetic-classes 4 --amp --arch "
                                    "resnet18 --image-size 16 --batch-size 4"
                                    " --max-steps 1 --epochs 1 --warmup-epochs 0 --threads 1 2>&1");
  if (rc == 0) GTEST_SKIP() << "this LibTorch's oneDNN computes bf16 convolutions with AVX2";
  const size_t at = out.find("aiacc_train: error: --amp: this machine cannot compute a convolution in bf16 on cpu");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NE(out.find("run without --amp", at), std::string::npos) << out;
  EXPECT_EQ(out.find("step 1"), std::string::npos) << "said before training\n" << out;
  EXPECT_EQ(std::count(out.begin() + static_cast<std::ptrdiff_t>(at), out.end(), '\n'), 1) << out;
}

// A run started afresh in a --checkpoint-dir that holds an earlier run's checkpoint of a later
// step: rank 0 says so at the start, that checkpoint stays, and the run keeps its own newest
// --keep-checkpoints (retention by step kept only the one just written: each epoch's checkpoint
// deleted the one before).
TEST(Cli, AnEarlierRunsLaterCheckpointIsSaidKeptAndNotCounted) {
  test::TempDir d;
  CheckpointDir(d / "ck").write(999, "an earlier run's checkpoint");
  const auto [rc, out] = runTrain(strCat("--data synthetic --synthetic-images 16 --synthetic-classes 4 --arch resnet18 "
                                         "--image-size 16 --batch-size 4 --epochs 3 --warmup-epochs 0 --threads 1 "
                                         "--keep-checkpoints 2 --checkpoint-dir ",
                                         d / "ck"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(strCat("--checkpoint-dir ", d / "ck",
                            " holds 1 checkpoint(s) of later steps than this run's "
                            "start at step 0 (the newest: step 999)")),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(to go on from what `latest` names now instead: --resume auto"), std::string::npos) << out;
  EXPECT_EQ(checkpointSteps(d / "ck"), (std::vector<int64_t>{999, 12, 8})) << out;
  EXPECT_EQ(test::readText(d / "ck/latest"), checkpointPayloadName(12) + "\n");
}

// aiacc_bench, built beside aiacc_train.
std::string benchBin() {
  std::string bench = AIACC_TRAIN_BIN;
  return bench.replace(bench.rfind("aiacc_train"), std::string("aiacc_train").size(), "aiacc_bench");
}

TEST(Cli, HelpExplainsEveryFlag) {
  auto [rc, out] = runTrain("--help");
  EXPECT_EQ(rc, 0);
  for (const char* f : {"--data",
                        "--arch",
                        "--batch-size",
                        "--epochs",
                        "--lr ",
                        "--warmup-epochs",
                        "--lr-schedule",
                        "--momentum",
                        "--nesterov",
                        "--weight-decay",
                        "--label-smoothing",
                        "--image-size",
                        "--resize-schedule",
                        "--workers",
                        "--seed",
                        "--max-steps",
                        "--target-top1",
                        "--target-top5",
                        "--eval-every",
                        "--checkpoint-dir",
                        "--resume",
                        "--metrics-file",
                        "--report-file",
                        "--recipe",
                        "--dawnbench-dir",
                        "--make-sample",
                        "--gpus",
                        "--amp ",
                        "--amp-dtype",
                        "--channels-last",
                        "--cudnn-benchmark"}) {
    EXPECT_NE(out.find(f), std::string::npos) << f;
  }
  // aiacc_bench: its own flags, none of the libraries' (Debian's LibTorch registers caffe2 ones).
  const std::string bench = benchBin();
  std::tie(rc, out) = runCommand(bench + " --help 2>&1");
  EXPECT_EQ(rc, 0);
  for (const char* f : {"usage: aiacc_bench data", "--image-size", "--entropy-only", "--breakdown", "--bytes",
                        "--max-nproc", "--hierarchical", "--ranks-per-node"}) {
    EXPECT_NE(out.find(f), std::string::npos) << f;
  }
  EXPECT_EQ(out.find("caffe2"), std::string::npos) << out.substr(0, 2000);
}

// aiacc_bench data --breakdown times every stage on real JPEGs and accounts for each image.
TEST(Cli, BenchDataBreakdownTimesEachStage) {
  test::TempDir d;
  const std::string sample = d / "sample";
  auto [rc, out] = runTrain("--make-sample " + sample +
                            " --sample-classes 2 --sample-train-per-class 3 "
                            "--sample-val-per-class 1 --sample-min-side 100 --sample-max-side 140");
  ASSERT_EQ(rc, 0) << out;
  const std::string bench = benchBin();
  std::tie(rc, out) = runCommand(bench + " data --data " + sample + " --breakdown --image-size 32 --repeat 2 2>&1");
  EXPECT_EQ(rc, 0) << out;
  for (const char* f : {"12 images at 32 px", "read file", "Huffman down to the crop's bottom", "decode the crop",
                        "resize + mirror + normalize", "images/s"}) {
    EXPECT_NE(out.find(f), std::string::npos) << f << "\n" << out;
  }
}

// aiacc_bench data refuses input it cannot measure with one error line and exit code 1 (it
// printed "0 images ... 0.0 images/s" and exited 0): fewer files than a batch; a single batch in
// all (the first batch starts the clock and is not timed); files none of which decodes, on
// either path.
TEST(Cli, BenchDataRefusesInputItCannotMeasure) {
  test::TempDir d;
  const std::string sample = d / "sample";  // 4 training JPEGs
  auto [rc, out] = runTrain("--make-sample " + sample +
                            " --sample-classes 2 --sample-train-per-class 2 "
                            "--sample-val-per-class 1 --sample-min-side 100 --sample-max-side 140");
  ASSERT_EQ(rc, 0) << out;
  for (int i = 0; i < 8; ++i) test::writeText(d / ("junk/train/a/" + std::to_string(i) + ".jpg"), "not a JPEG");
  auto bench = [&](const std::string& args) {
    return runCommand(benchBin() + " data --image-size 32 " + args + " 2>&1");
  };
  auto refused = [&](const std::string& args, const std::string& why) {
    const auto [code, text] = bench(args);
    EXPECT_EQ(code, 1) << args << "\n" << text;
    // One line, the last (after a warning per undecodable file), saying why.
    const size_t at = text.find("aiacc_bench: error: ");
    ASSERT_NE(at, std::string::npos) << args << "\n" << text;
    const std::string line = text.substr(at);
    EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << args << "\n" << text;
    EXPECT_NE(line.find(why), std::string::npos) << args << ": want '" << why << "'\n" << text;
    EXPECT_EQ(text.find("images/s"), std::string::npos) << args << ": no throughput from nothing\n" << text;
  };
  refused("--data " + sample + " --batch-size 8", "4 images, fewer than one batch (--batch-size 8)");
  refused("--data " + sample + " --batch-size 3", "1 batch in all");  // 4 / 3: one full batch
  refused("--data " + d.path() + "/junk --batch-size 4", "none of the 8 files in " + d.path() + "/junk/train decoded");
  refused("--data " + d.path() + "/junk --entropy-only",
          "none of the 8 files in " + d.path() + "/junk/train entropy-decodes");
  // The same folder, measurable: two batches after the first (one pass), or a second pass.
  for (const char* ok : {" --batch-size 1", " --batch-size 4 --repeat 2"}) {
    std::tie(rc, out) = bench("--data " + sample + ok);
    EXPECT_EQ(rc, 0) << ok << "\n" << out;
    EXPECT_NE(out.find("images/s total"), std::string::npos) << ok << "\n" << out;
  }
}

TEST(Cli, BadInputIsOneClearLine) {
  test::TempDir d;
  auto [rc, out] = runTrain("--data " + d.path() + "/nope");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("error: --data folder"), std::string::npos) << out;
  std::tie(rc, out) = runTrain("--data synthetic --arch resnet7");
  EXPECT_EQ(rc, 2) << "a usage error";
  EXPECT_NE(out.find("unknown --arch 'resnet7'"), std::string::npos) << out;
  std::tie(rc, out) = runTrain("--data synthetic --lr-schedule wavy");
  EXPECT_EQ(rc, 2) << "a usage error";
  EXPECT_NE(out.find("--lr-schedule must be"), std::string::npos) << out;
  test::writeText(d / "broken.ckpt", "garbage");
  std::tie(rc, out) = runTrain("--data synthetic --arch resnet18 --synthetic-classes 4 --resume " + d.path() +
                               "/broken.ckpt");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("cannot read checkpoint"), std::string::npos) << out;
  std::tie(rc, out) = runTrain("--data synthetic --amp-dtype fp8");
  EXPECT_EQ(rc, 2) << "a usage error";
  EXPECT_NE(out.find("--amp-dtype must be fp16, bf16 or auto"), std::string::npos) << out;
  std::tie(rc, out) = runTrain("--data synthetic --amp --amp-dtype fp16");
  EXPECT_EQ(rc, 2) << "a usage error";
  EXPECT_NE(out.find("--amp-dtype fp16 needs --gpus"), std::string::npos) << out;
  // What gflags would end the process for (with exit 1 and its own words) is a usage error.
  for (const auto& [args, line] : std::vector<std::pair<std::string, std::string>>{
           {"--data synthetic --epochz 3", "aiacc_train: error: unknown flag --epochz (see --help)\n"},
           {"--data synthetic --epochs three",
            "aiacc_train: error: --epochs: 'three' is not a valid value (int32) (see --help)\n"},
           {"--data synthetic stray",
            "aiacc_train: error: unexpected argument 'stray' (flags start with --; see --help)\n"}}) {
    std::tie(rc, out) = runTrain(args);
    EXPECT_EQ(rc, 2) << args << "\n" << out;
    EXPECT_EQ(out, line) << args;
  }
  std::tie(rc, out) = runTrain("--epochs 3");
  EXPECT_EQ(rc, 2) << "a usage error";
  EXPECT_NE(out.find("aiacc_train: error: no --data given"), std::string::npos) << out;
  if (!torch::cuda::is_available()) {  // a GPU where there is none: said at once, in one line
    std::tie(rc, out) = runTrain("--gpus 2 --data synthetic");
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("--gpus needs a CUDA build of aiacc and a visible GPU"), std::string::npos) << out;
  }
}

// Real processes: the launcher starts two workers that rendezvous over TCP and train together.
TEST(Launcher, TwoProcessesTrainTogether) {
  test::TempDir d;
  auto [rc, out] = runTrain("--nproc 2 --master 127.0.0.1:29641 --data synthetic --arch resnet18 "
                            "--synthetic-classes 4 --synthetic-images 128 --batch-size 8 --image-size 32 "
                            "--epochs 1 --warmup-epochs 0 --max-steps 4 --threads 1 --report-file " +
                            d.path() + "/r.json");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(2 processes)"), std::string::npos) << out;
  const Json json = test::readJson(d / "r.json");
  EXPECT_EQ(json.at("world_size"), 2) << json;
  EXPECT_EQ(json.at("images_seen"), 64) << json;  // 4 steps x 8 x 2 ranks
}

// --hierarchical on with one rank per node: two "nodes" on this machine, two-level reduction.
TEST(Launcher, TwoLevelReductionAcrossEmulatedNodes) {
  AIACC_SKIP_WITHOUT_GLOO();
  auto [rc, out] = runTrain("--nproc 2 --master 127.0.0.1:29647 --data synthetic --arch resnet18 "
                            "--synthetic-classes 4 --synthetic-images 64 --batch-size 8 --image-size 32 "
                            "--epochs 1 --warmup-epochs 0 --max-steps 2 --threads 1 --hierarchical on "
                            "--ranks-per-node 1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("communication    two-level, 2 nodes x 1 ranks"), std::string::npos) << out;
  std::tie(rc, out) = runTrain("--nproc 2 --master 127.0.0.1:29647 --data synthetic --hierarchical on "
                               "--ranks-per-node 3 --max-steps 1");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("not a multiple of 3 ranks per node"), std::string::npos) << out;
}

// --timeline: compute spans on row 0 and one row per communication channel.
TEST(Launcher, TimelineHasComputeAndChannelRows) {
  test::TempDir d;
  auto [rc, out] = runTrain("--nproc 2 --master 127.0.0.1:29645 --data synthetic --arch resnet18 "
                            "--synthetic-classes 4 --synthetic-images 128 --batch-size 8 --image-size 32 "
                            "--epochs 1 --warmup-epochs 0 --max-steps 3 --threads 1 --streams 2 --timeline " +
                            d.path() + "/new/t.json");  // (a folder the run makes first)
  ASSERT_EQ(rc, 0) << out;
  const Json events = test::readJson(d.path() + "/new/t.json");
  ASSERT_TRUE(events.is_array());
  auto has = [&](const std::string& name, const std::string& ph, int tid) {
    return std::any_of(events.begin(), events.end(), [&](const Json& e) {
      return e.at("name") == name && e.at("ph") == ph && e.at("pid") == 0 && e.at("tid") == tid;
    });
  };
  EXPECT_TRUE(has("backward", "X", 0));
  EXPECT_TRUE(has("allreduce", "X", 1));
  EXPECT_TRUE(std::any_of(events.begin(), events.end(), [](const Json& e) {
    return e.at("ph") == "M" && e.at("args").at("name") == "shm channel 1";  // one host: shared memory
  }));
  for (const Json& e : events) {
    if (e.at("ph") == "X") {
      EXPECT_GE(e.at("dur").get<double>(), 0) << e;
    }
  }
}

// A worker killed mid-run ends the job: the launcher names the rank and the signal, stops the
// other worker and exits non-zero; nothing is left running.
TEST(Launcher, KilledWorkerEndsTheJobWithoutOrphans) {
  test::TempDir d;
  const std::string marker = d.path() + "/metrics.jsonl";
  const std::string script =
      std::string(AIACC_TRAIN_BIN) +
      " --nproc 2 --master 127.0.0.1:29643 --data synthetic "
      "--arch resnet18 --synthetic-classes 4 --synthetic-images 100000 --batch-size 4 --image-size 32 "
      "--epochs 1 --warmup-epochs 0 --threads 1 --comm-timeout 20 --metrics-file " +
      marker + " > " + d.path() +
      "/log 2>&1 & L=$!; "
      "for i in $(seq 100); do [ -s " +
      marker +
      " ] && break; sleep 0.2; done; "
      "C=$(pgrep -P $L | head -1); kill -9 $C; wait $L; echo rc=$?; sleep 1; "
      "pgrep -f -- '" +
      marker + "' >/dev/null && echo orphans || echo clean; cat " + d.path() + "/log";
  test::writeText(d / "kill.sh", script + "\n");
  const std::string out = runCommand("bash " + d.path() + "/kill.sh").second;
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
  EXPECT_NE(out.find("clean"), std::string::npos) << out;
  EXPECT_NE(out.find("was killed by signal 9"), std::string::npos) << out;
}

// The emulated cluster: two namespaces joined by 1 Gbit/s links, aiacc_train across them with
// two ranks per node and two-level reduction; then everything the lab made is gone. Needs root
// (CI runs as root); without it, the script's refusal is what is checked.
TEST(NetLab, TwoNodesTrainAcrossRateLimitedLinks) {
  AIACC_SKIP_WITHOUT_GLOO();
  const std::string script = test::sourceDir() + "/scripts/netlab.sh";
  const std::string env = "env AIACC_NETLAB_PREFIX=aiacc-test AIACC_NETLAB_SUBNET=10.232.0 ";
  const std::string lab = env + "bash " + script;
  if (::geteuid() != 0) {
    auto [rc, out] = runCommand(lab + " up --nodes 2 --bw 1gbit 2>&1");
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find("must run as root"), std::string::npos) << out;
    GTEST_SKIP() << "not root: the lab itself needs network namespaces";
  }
  // As nobody (the script arrives on stdin: its folder may not be readable by nobody).
  auto [rc, out] = runCommand("setpriv --reuid=65534 --regid=65534 --clear-groups " + env +
                              "bash -s up --nodes 2 "
                              "--bw 1gbit < " +
                              script + " 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("must run as root"), std::string::npos) << out;
  struct Down {  // whatever happens below, the lab goes
    std::string cmd;
    ~Down() { runCommand(cmd); }
  } down{lab + " down > /dev/null 2>&1"};
  std::tie(rc, out) = runCommand(lab + " up --nodes 2 --bw 1gbit 2>&1 && " + lab + " status 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("aiacc-test-n1: 10.232.0.2/24"), std::string::npos) << out;
  EXPECT_NE(out.find("rate 1Gbit"), std::string::npos) << out;
  std::tie(rc, out) = runCommand(lab + " run 7 -- true 2>&1");
  EXPECT_NE(out.find("node 7 does not exist"), std::string::npos) << out;
  const std::string train = std::string(AIACC_TRAIN_BIN) +
                            " --nproc 2 --nnodes 2 --master 10.232.0.1:29649 --data synthetic --arch resnet18 "
                            "--synthetic-classes 4 --synthetic-images 64 --batch-size 4 --image-size 32 --epochs 1 "
                            "--warmup-epochs 0 --max-steps 2 --threads 1 --comm-timeout 60 --noautotune";
  std::tie(rc, out) = runCommand("(" + lab + " run 1 -- " + train + " --node-rank 1 > /dev/null 2>&1 &); " + lab +
                                 " run 0 -- " + train + " --node-rank 0 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(4 processes)"), std::string::npos) << out;
  EXPECT_NE(out.find("two-level, 2 nodes x 2 ranks"), std::string::npos) << out;
  std::tie(rc, out) = runCommand(lab + " down 2>&1; ip netns list | grep -c aiacc-test");
  EXPECT_EQ(out.find("aiacc-test-"), std::string::npos) << out;
  EXPECT_NE(out.find("0"), std::string::npos) << out;
}

}  // namespace
}  // namespace aiacc::app
