// The records beside the report (app/run_records.h): summary.csv with timm's columns, args.json
// typed, and args.flags, which --flagfile takes back to rerun the same settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "app/run_records.h"
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

// Closed form: each epoch's row takes the last evaluation within it; an epoch without one has
// empty eval cells; a last epoch the run stopped inside is fractional; NaN is an empty cell.
TEST(RunRecords, SummaryRowsTakeEachEpochsLastEvaluation) {
  const std::vector<EpochTrain> epochs{{1, 2.5, 0.1}, {2, 1.25, 0.05}, {3, 1.0, 0.025}, {3.5, std::nan(""), 0.0125}};
  const std::vector<EvalPoint> evals{
      {10, 0.5, 1, 10, 50, 3.0, 80},    // within epoch 1, not its last
      {20, 1.0, 2, 20, 60, 2.0, 80},    // epoch 1's last
      {40, 2.0, 4, 30, 70, 1.5, 80},    // epoch 2's
      {70, 3.5, 7, 40, 80, 1.125, 80},  // the fractional last epoch's
  };
  EXPECT_EQ(summaryCsv(epochs, evals), "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n"
                                       "1,2.5,2,20,60,0.1\n"
                                       "2,1.25,1.5,30,70,0.05\n"
                                       "3,1,,,,0.025\n"
                                       "3.5,,1.125,40,80,0.0125\n");
  EXPECT_EQ(summaryCsv({}, evals), "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n");
}

std::vector<std::vector<std::string>> csvRows(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> cells(1);
    for (char ch : line) {
      if (ch == ',') {
        cells.emplace_back();
      } else {
        cells.back() += ch;
      }
    }
    rows.push_back(cells);
  }
  return rows;
}

const std::string kJob =
    " --data synthetic --arch resnet18 --synthetic-classes 4 --synthetic-images 64 --batch-size 8 --image-size 32 "
    "--warmup-epochs 0 --threads 1 --comm-timeout 60 --epochs 2 ";

// A 2-epoch run: summary.csv's rows agree with the metrics file (the epoch's step losses averaged
// over its images, its last lr, its evaluation); args.json holds every flag, typed.
TEST(RunRecords, SummaryAndArgsAgreeWithTheRun) {
  test::TempDir d;
  const auto [rc, out] = test::runShell(std::string(AIACC_TRAIN_BIN) + kJob + "--metrics-file " + (d / "m.jsonl") +
                                        " --report-file " + (d / "r.json") + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  const std::vector<Json> steps = test::jsonLines(d / "m.jsonl", "step");
  const std::vector<Json> evals = test::jsonLines(d / "m.jsonl", "eval");
  ASSERT_EQ(steps.size(), 16u) << "2 epochs of 64 images in batches of 8";
  ASSERT_EQ(evals.size(), 2u);
  const auto rows = csvRows(d / "summary.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"epoch", "train_loss", "eval_loss", "eval_top1", "eval_top5", "lr"}));
  for (size_t e = 0; e < 2; ++e) {
    ASSERT_EQ(rows[e + 1].size(), 6u);
    EXPECT_EQ(rows[e + 1][0], std::to_string(e + 1));
    double mean = 0;
    for (size_t i = 8 * e; i < 8 * e + 8; ++i) mean += steps[i].at("loss").get<double>() / 8;
    EXPECT_NEAR(std::stod(rows[e + 1][1]), mean, 1e-12 * mean) << "epoch " << e + 1;
    EXPECT_EQ(std::stod(rows[e + 1][2]), evals[e].at("loss").get<double>());
    EXPECT_EQ(std::stod(rows[e + 1][3]), evals[e].at("top1").get<double>());
    EXPECT_EQ(std::stod(rows[e + 1][4]), evals[e].at("top5").get<double>());
    EXPECT_EQ(std::stod(rows[e + 1][5]), steps[8 * e + 7].at("lr").get<double>());
  }
  const Json args = test::readJson(d / "args.json");
  EXPECT_EQ(args.at("epochs"), 2);
  EXPECT_EQ(args.at("data"), "synthetic");
  EXPECT_EQ(args.at("nesterov"), false);
  EXPECT_EQ(args.at("warmup_epochs"), 0.0);
  EXPECT_EQ(args.at("log_every"), 1);
  EXPECT_TRUE(args.at("metrics_file").is_string());
  // args.flags: the flags the command line gave, with args.json's values; nothing else.
  std::vector<std::string> given;
  for (const auto& row : csvRows(d / "args.flags")) given.push_back(row.at(0));
  EXPECT_EQ(given.size(), 12u) << "kJob's 10 flags, --metrics-file, --report-file";
  EXPECT_NE(std::find(given.begin(), given.end(), "--epochs=2"), given.end());
  EXPECT_NE(std::find(given.begin(), given.end(), "--data=synthetic"), given.end());
  EXPECT_NE(std::find(given.begin(), given.end(), "--warmup_epochs=0"), given.end());
  EXPECT_EQ(std::find(given.begin(), given.end(), "--nesterov=false"), given.end()) << "not given";
}

// args.flags reruns the same settings: a rank started from it agrees with a rank started from the
// original command line at the start-up agreement, and trains with it; one setting changed after
// the flag file is refused there, named.
TEST(RunRecords, FlagFileRerunAgreesAtStartUp) {
  test::TempDir d;
  const std::string first = std::string(AIACC_TRAIN_BIN) + kJob + "--max-steps 1 --report-file " + (d / "r.json");
  auto [rc, out] = test::runShell(first + " 2>&1");
  ASSERT_EQ(rc, 0) << out;
  int port = 0;
  auto rank = [&](int r, const std::string& args) {
    return "env AIACC_RANK=" + std::to_string(r) + " AIACC_WORLD_SIZE=2 AIACC_LOCAL_RANK=" + std::to_string(r) +
           " AIACC_LOCAL_SIZE=2 AIACC_MASTER=127.0.0.1:" + std::to_string(port) + " " + AIACC_TRAIN_BIN + " " + args;
  };
  auto pair = [&](const std::string& rank1_args) {
    port = test::freePort();
    return test::runShell("(" + rank(1, rank1_args) + " > " + d.path() + "/log1 2>&1; echo $? > " + d.path() +
                          "/rc1) & " + rank(0, kJob + "--max-steps 2 --report-file " + (d / "r2.json")) +
                          " 2>&1; echo rc0=$?; wait; echo rc1=$(cat " + d.path() + "/rc1); cat " + d.path() + "/log1");
  };
  // Flags after the flag file override its values, as gflags reads them in order: this rerun
  // goes to step 2 (an agreed setting, so rank 0 says the same) and writes another report.
  std::tie(rc, out) = pair("--flagfile=" + (d / "args.flags") + " --max-steps 2 --report-file " + (d / "r2.json"));
  EXPECT_NE(out.find("rc0=0"), std::string::npos) << out;
  EXPECT_NE(out.find("rc1=0"), std::string::npos) << out;
  EXPECT_EQ(test::readJson(d / "r2.json").at("world_size"), 2);
  std::tie(rc, out) = pair("--flagfile=" + (d / "args.flags") + " --max-steps 2 --lr 0.2");
  EXPECT_NE(out.find("rc1=1"), std::string::npos) << out;
  EXPECT_NE(out.find("ranks were started with different settings: --lr (per 256 images) is 0.2 on rank 1"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace aiacc::app
