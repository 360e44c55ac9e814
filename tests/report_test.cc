// The report's files: the JSON report through nlohmann-json and the DAWNBench submission.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "app/config.h"
#include "app/report.h"
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

// The report through nlohmann-json: doubles read back to the same value; NaN is null; a data path
// that is not UTF-8 (file names are bytes) still gives JSON that Python's json.load reads.
TEST(Report, JsonRoundTripsDoublesAndSurvivesPathsThatAreNotUtf8) {
  test::TempDir d;
  Report r;
  r.arch = "resnet18";
  r.data = "/data/caf\xe9/\xff\xfe";  // a Latin-1 e-acute, and two bytes no UTF-8 text has
  r.final_top1 = 0.1 + 0.2;           // 0.30000000000000004: 17 digits to read back
  r.mean_images_per_s = 1.0 / 3.0;
  r.total_s = std::nan("");
  r.evals = {EvalPoint{1, 1.0 / 7.0, 2.5, 12.345678901234567, 50, 2.0, 80}};
  const std::string text = reportJson(r, Config{});
  const Json j = Json::parse(text);
  EXPECT_EQ(j.at("final_top1").get<double>(), r.final_top1);
  EXPECT_EQ(j.at("mean_images_per_s").get<double>(), r.mean_images_per_s);
  EXPECT_EQ(j.at("evals")[0].at("top1").get<double>(), r.evals[0].top1);
  EXPECT_EQ(j.at("evals")[0].at("epoch").get<double>(), r.evals[0].epoch);
  EXPECT_TRUE(j.at("total_s").is_null());
  EXPECT_EQ(j.at("data"), "/data/caf\uFFFD/\uFFFD\uFFFD") << "each byte that is not UTF-8 becomes U+FFFD";
  test::writeText(d / "r.json", text);
  const auto [rc,
              out] = test::runShell("python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); "
                                    "print(repr(r[\"final_top1\"]), r[\"data\"].count(chr(0xfffd)), r[\"total_s\"])' " +
                                    d.path() + "/r.json 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "0.30000000000000004 3 None\n");
}

TEST(Report, DawnbenchFilesHaveTheFields) {
  test::TempDir d;
  Report r;
  r.arch = "resnet50";
  r.world = 8;
  r.machine = machineInfo();
  r.evals = {EvalPoint{100, 1.0, 360.0, 50.5, 75.25, 2.0, 50000}, EvalPoint{200, 2.0, 720.0, 60, 93.5, 1.5, 50000}};
  Config c;
  c.recipe_text = "epochs = 21\n";
  c.cost_per_hour = 24.48;
  writeDawnbench(d / "db", r, c);
  std::ifstream tsv(d / "db/aiacc_resnet50_8proc.tsv");
  std::string header, row1, row2;
  std::getline(tsv, header);
  std::getline(tsv, row1);
  std::getline(tsv, row2);
  EXPECT_EQ(header, "epoch\thours\ttop1Accuracy\ttop5Accuracy");
  EXPECT_EQ(row1, "1\t0.1\t50.5\t75.25");
  EXPECT_EQ(row2, "2\t0.2\t60\t93.5");
  const Json json = test::readJson(d / "db/aiacc_resnet50_8proc.json");
  for (const char* key :
       {"version", "author", "authorEmail", "framework", "codeURL", "model", "hardware", "timestamp"}) {
    EXPECT_TRUE(json.at(key).is_string()) << key;
  }
  EXPECT_EQ(json.at("costPerHour"), 24.48);
  EXPECT_EQ(json.at("misc").at("recipe"), "epochs = 21\n");
  EXPECT_EQ(json.at("misc").at("epochs"), r.epochs);
}

}  // namespace
}  // namespace aiacc::app
