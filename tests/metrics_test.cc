// The job's numbers in what aiacc writes: --log-every windows (the loss averaged over the window's
// images), and counts summed over the ranks (images trained, undecodable files skipped). The
// 2-rank loss average itself is checked against PyTorch in train_golden_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "app/trainer.h"
#include "tests/json_util.h"
#include "tests/test_util.h"
#include "tests/train_problem.h"

namespace aiacc::app {
namespace {

// --log-every 4: one line per 4 steps whose loss is the mean of those 4 steps' losses over their
// images (what 4 lines of --log-every 1 say), with the window's images and steps; training itself
// is the same.
TEST(Metrics, LogEveryAveragesTheStepsOfEachLine) {
  test::TempDir d;
  test::makeLearnableSample(d / "ds");
  std::vector<std::vector<Json>> lines;
  std::vector<Report> reports;
  for (int64_t every : {1, 4}) {
    Config c = test::learnableConfig(d / "ds");
    c.max_steps = 8;
    c.log_every = every;
    c.metrics_file = d / ("m" + std::to_string(every) + ".jsonl");
    reports.push_back(Trainer(c, {}, localSync(), Trainer::Clock::now()).run());
    lines.push_back(test::jsonLines(c.metrics_file, "step"));
  }
  ASSERT_EQ(lines[0].size(), 8u);
  ASSERT_EQ(lines[1].size(), 2u);
  for (size_t w = 0; w < 2; ++w) {
    const Json& line = lines[1][w];
    EXPECT_EQ(line.at("step"), 4 * (w + 1));
    EXPECT_EQ(line.at("steps"), 4);
    EXPECT_EQ(line.at("images"), 4 * 16);
    double mean = 0;
    for (size_t i = 4 * w; i < 4 * w + 4; ++i) {
      EXPECT_EQ(lines[0][i].at("steps"), 1);
      EXPECT_EQ(lines[0][i].at("images"), 16);
      mean += lines[0][i].at("loss").get<double>() / 4;
    }
    EXPECT_NEAR(line.at("loss").get<double>(), mean, 1e-12 * mean) << "window " << w;
    EXPECT_EQ(line.at("lr"), lines[0][4 * w + 3].at("lr")) << "the window's last step's";
  }
  EXPECT_EQ(reports[0].final_top1, reports[1].final_top1) << "the same training";
  EXPECT_EQ(reports[1].images_seen, 8 * 16);
}

// Two real processes, three undecodable train files among 320: one epoch trains every file once
// (160 per rank, 20 batches of 8, no tail), so the job met each bad file once on one rank.
// The report counts the job's images (317, not rank 0's count times 2) and its skipped files (3,
// not rank 0's alone); the metrics lines' images add up to the same 317.
TEST(Metrics, CountsAreTheJobsOverTwoRanks) {
  test::TempDir d;
  test::makeLearnableSample(d / "ds");
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(d / "ds/train")) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 320u);
  for (size_t i : {3u, 100u, 250u}) test::writeText(files[i], "not a JPEG");
  const std::string cmd = std::string(AIACC_TRAIN_BIN) +
                          " --nproc 2 --master 127.0.0.1:" + std::to_string(test::freePort()) + " --data " +
                          (d / "ds") +
                          " --arch resnet18 --batch-size 8 --image-size 32 --epochs 1 --warmup-epochs 0 "
                          "--threads 1 --workers 1 --log-every 3 --metrics-file " +
                          (d / "m.jsonl") + " --report-file " + (d / "r.json") + " 2>&1";
  const auto [rc, out] = test::runShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  const Json report = test::readJson(d / "r.json");
  EXPECT_EQ(report.at("steps"), 20);
  EXPECT_EQ(report.at("skipped_files"), 3) << out;
  EXPECT_EQ(report.at("images_seen"), 320 - 3);
  int64_t images = 0, steps = 0;
  for (const Json& line : test::jsonLines(d / "m.jsonl", "step")) {
    images += line.at("images").get<int64_t>();
    steps += line.at("steps").get<int64_t>();
  }
  EXPECT_EQ(images, 320 - 3);
  EXPECT_EQ(steps, 20) << "7 lines: 6 of 3 steps, and the 2 before the evaluation";
}

// --tensorboard-dir: TensorBoard's own reader (scripts/tensorboard_check.py, the pinned tensorboard
// of scripts/tools_venv.sh) finds exactly the metrics file's points, one per tag and line, and the
// resolved flags as a text summary.
TEST(Metrics, TensorBoardHoldsTheMetricsFilesPoints) {
  test::TempDir d;
  const std::string cmd = std::string(AIACC_TRAIN_BIN) +
                          " --data synthetic --synthetic-classes 4 --synthetic-images 64 --batch-size 8 "
                          "--image-size 32 --arch resnet18 --epochs 1 --warmup-epochs 0 --max-steps 6 --threads 1 "
                          "--log-every 2 --eval-every 3 --metrics-file " +
                          (d / "m.jsonl") + " --tensorboard-dir " + (d / "tb") + " 2>&1";
  const auto [rc, out] = test::runShell(cmd);
  ASSERT_EQ(rc, 0) << out;
  Json scalars = Json::object();
  size_t points = 0;
  auto add = [&](const std::string& tag, const Json& line, const char* key) {
    scalars[tag].push_back(Json::array({line.at("step"), line.at(key), nullptr}));  // wall time not checked
    ++points;
  };
  const std::vector<Json> steps = test::jsonLines(d / "m.jsonl", "step");
  const std::vector<Json> evals = test::jsonLines(d / "m.jsonl", "eval");
  ASSERT_EQ(steps.size(), 4u) << "steps 2, 3 (before the evaluation), 5, 6";
  ASSERT_EQ(evals.size(), 2u);
  for (const Json& line : steps) {
    add("train/loss", line, "loss");
    add("train/lr", line, "lr");
    add("train/images_per_s", line, "images_per_s");
    add("train/exposed_comm_s", line, "exposed_comm_s");
    add("train/skipped_steps", line, "skipped_steps");
  }
  for (const Json& line : evals) {
    add("eval/top1", line, "top1");
    add("eval/top5", line, "top5");
    add("eval/loss", line, "loss");
  }
  const Json config = Json::array({0, nullptr, nullptr, {"<td>--tensorboard-dir</td>", "<td>--log-every</td>"}});
  const Json expected{{"records", 1 + points + 1},  // the file version, the points, the flags
                      {"start_wall_time", nullptr},
                      {"scalars", scalars},
                      {"texts", {{"config", Json::array({config})}}}};
  test::writeText(d / "expected.json", toJsonLine(expected));
  const std::string python = AIACC_TOOLS_PYTHON;
  ASSERT_TRUE(std::filesystem::exists(python))
      << python << " is missing: run scripts/setup.sh (scripts/tools_venv.sh installs the pinned tensorboard)";
  const auto [check_rc, check_out] = test::runShell(python + " " + test::sourceDir() +
                                                    "/scripts/tensorboard_check.py " + (d / "tb") + " " +
                                                    (d / "expected.json") + " 2>&1");
  EXPECT_EQ(check_rc, 0) << check_out;
}

}  // namespace
}  // namespace aiacc::app
