#include "tests/elastic_job.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>
#include <sstream>

#include "aiacc/config.h"
#include "aiacc/common/error.h"
#include "app/elastic.h"

namespace aiacc::app::test_elastic {
namespace {

// A line of a sample log (AIACC_TEST_SAMPLE_LOG, app/test_hooks.h): "step RUN GEN STEP EPOCH
// ids...", written before the step; "applied RUN GEN STEP" after it; "restore RUN GEN STEP".
struct SampleLine {
  std::string kind, run;
  int64_t generation = 0, step = 0, epoch = 0;  // (epoch: step lines only)
  std::vector<int64_t> samples;                 // (step lines only)
};

// Every line of every rank's sample log in `dir` (the files samples.<pid>).
std::vector<SampleLine> sampleLines(const std::string& dir) {
  std::vector<SampleLine> lines;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().filename().string().rfind("samples.", 0) != 0) continue;
    std::ifstream in(f.path());
    for (std::string text; std::getline(in, text);) {
      std::istringstream words(text);
      SampleLine l;
      if (!(words >> l.kind >> l.run >> l.generation >> l.step)) continue;
      if (l.kind == "step") {
        if (!(words >> l.epoch)) continue;  // (a line cut short by a rank's death)
        for (int64_t id; words >> id;) l.samples.push_back(id);
      }
      lines.push_back(std::move(l));
    }
  }
  return lines;
}

// What the sample logs say about epoch 0: how often each sample was trained, counting a step only
// if some rank applied it and no later generation of its run restored a state from before it (a
// step some rank applied that the others did not is trained again); *trained: the images of every
// such step, all epochs. Each rank logs a step's samples before the step, and says when it applied
// it (app/test_hooks.h): a rank killed in a step the others kept has its samples counted.
std::map<int64_t, int> epochZeroCounts(const std::string& dir, std::string* restores, int64_t* trained) {
  using Key = std::tuple<std::string, int64_t, int64_t>;        // run, generation, step
  std::map<std::pair<std::string, int64_t>, int64_t> restored;  // (run, generation) -> the step it went on from
  std::set<Key> applied;
  std::vector<SampleLine> steps;
  for (SampleLine& l : sampleLines(dir)) {
    if (l.kind == "restore") {
      restored[{l.run, l.generation}] = l.step;
    } else if (l.kind == "applied") {
      applied.insert({l.run, l.generation, l.step});
    } else if (l.kind == "step") {
      steps.push_back(std::move(l));
    }
  }
  for (const auto& [rg, s] : restored) *restores += strCat("generation ", rg.second, " from step ", s, "; ");
  std::map<int64_t, int> counts;
  for (const SampleLine& st : steps) {
    bool redone = applied.count({st.run, st.generation, st.step}) == 0;
    for (const auto& [rg, s] : restored) {
      redone = redone || (rg.first == st.run && rg.second > st.generation && st.step > s);
    }
    if (!redone) *trained += static_cast<int64_t>(st.samples.size());
    if (redone || st.epoch != 0) continue;
    for (int64_t id : st.samples) ++counts[id];
  }
  return counts;
}

}  // namespace

Job runKilledJob(const test::TempDir& d, const JobSpec& spec) {
  const std::string& extra = spec.extra;
  const bool kubeflow = spec.kubeflow, server = spec.server;
  const std::string data = d / "ds";
  const auto made = test::runTrain(strCat("--make-sample ", data, " --sample-classes ", kClasses, " --sample-shapes ",
                                          spec.sample_shapes, " --sample-train-per-class ", kPerClass,
                                          " --sample-val-per-class ", spec.val_per_class,
                                          " --sample-min-side 40 --sample-max-side 64"));
  EXPECT_EQ(made.first, 0) << made.second;
  const std::string port = std::to_string(test::freePort());
  const std::string metrics = d / "m.jsonl";
  std::string script = "cd " + d.path() + "; " + (spec.env.empty() ? "" : "export " + spec.env + "; ");
  if (server) {
    script += strCat(AIACC_TRAIN_BIN, " --rendezvous-server --rdzv-endpoint ", spec.master_host, ":", port,
                     " > logS 2>&1 & S=$!; ");
  }
  auto node = [&](int n, const std::string& range, const std::string& more, const std::string& log) {
    const std::string launch = kubeflow ? strCat("PET_NNODES=", range, " PET_NODE_RANK=", n,
                                                 " PET_NPROC_PER_NODE=1 PET_MASTER_ADDR=", spec.master_host, " ",
                                                 "PET_MASTER_PORT=", port, " ")
                                        : std::string();
    const std::string flags = kubeflow
                                  ? std::string()
                                  : strCat(" --nproc 1 --nnodes ", range, " --node-rank ", n,
                                           server ? " --rdzv-endpoint " : " --master ", spec.master_host, ":", port);
    std::string prefix = spec.node_prefix;
    for (size_t at; (at = prefix.find("%N")) != std::string::npos;) prefix.replace(at, 2, std::to_string(n));
    return strCat(launch, "AIACC_TEST_SAMPLE_LOG=", d / "samples", " ", prefix, " ", AIACC_HOOKED_TRAIN_BIN, " --data ",
                  data, " --arch ", spec.arch, " --image-size 32 --rdzv-timeout 60 --rdzv-last-call 10 --batch-size ",
                  kBatch, " --epochs 2 --warmup-epochs 0 --threads 1 --workers 1 --log-every 2 --comm-timeout 60",
                  flags, " ", extra, more, n == 0 ? strCat(" --metrics-file ", metrics) : std::string(),
                  n == 0 || server ? strCat(" --report-file ", d / (n == 0 ? "r.json" : strCat("r", n, ".json")))
                                   : std::string(),
                  " > ", log, " 2>&1 & L", n, "=$!; ");
  };
  for (int n = 0; n < 3; ++n) script += node(n, spec.nnodes, "", strCat("log", n));
  // (A launcher that has ended already ends the wait: its job failed before the act, and the
  // output below says how.)
  script += test::shellWaitUntil(spec.when, 60, "kill -0 $L0 $L1 $L2") + "W=$(pgrep -P $L2); " + spec.act + "; ";
  const bool again2 = !spec.restart_node2_with.empty();
  if (again2) script += "wait $L2; " + node(2, spec.nnodes, " " + spec.restart_node2_with, "log2b");
  script += strCat("wait $L0; echo rc0=$?; wait $L1; echo rc1=$?; wait $L2; echo rc2=$?; ",
                   server ? "wait $S; echo rcS=$?; cat logS; " : "", "cat log0 log1 log2; ",
                   again2 ? "cat log2b; " : "");
  if (!spec.again.empty()) {
    // (Both nodes are MIN: no last call to wait for a third.)
    for (int n = 0; n < 2; ++n) script += node(n, spec.again, " --resume auto --rdzv-last-call 0", strCat("again", n));
    script += "wait $L0; echo again0=$?; wait $L1; echo again1=$?; cat again0 again1";
  }
  test::writeText(d / "job.sh", script + "\n");
  Job job;
  job.out = test::runShell("timeout 300 bash " + d.path() + "/job.sh 2>&1").second;
  const std::string report = d / (server ? "r1.json" : "r.json");
  if (std::filesystem::exists(report)) job.report = test::readJson(report);
  job.counts = epochZeroCounts(d.path(), &job.restores, &job.trained);
  return job;
}

void expectEachSampleOnce(const Job& job, int worlds_tail) {
  int twice = 0;
  for (const auto& [id, n] : job.counts) twice += n > 1 ? 1 : 0;
  EXPECT_EQ(twice, 0) << job.restores << job.out;
  const int unseen = kClasses * kPerClass - static_cast<int>(job.counts.size());
  EXPECT_GE(unseen, 0);
  EXPECT_LE(unseen, worlds_tail) << job.restores << job.out;
}

std::map<int64_t, std::vector<size_t>> batchSizesOf(const std::string& dir, int64_t g) {
  std::map<int64_t, std::vector<size_t>> sizes;
  for (const SampleLine& l : sampleLines(dir)) {
    if (l.kind == "step" && l.generation == g) sizes[l.step].push_back(l.samples.size());
  }
  return sizes;
}

JobSpec killedWhileHeld(const std::string& hold_variable) {
  JobSpec spec;
  spec.env = hold_variable + "=hold";
  spec.when = test::shellHeld("hold", 3);
  spec.act = "kill -KILL $W; touch hold";
  return spec;
}

JobSpec comesBackAt(int64_t back_at, const std::string& fault, const std::string& then) {
  // (Each wait bounded, 60 s: a job that never gets there fails the test on its assertions.)
  JobSpec spec;
  spec.env = strCat("AIACC_TEST_HOLD_AT_STEP=2:out,", back_at, ":back");
  spec.when = test::shellHeld("out", 3);
  spec.act = fault + "; touch out; " + test::shellWaitUntil(test::shellHeld("back", 2), 60) + then + "; " +
             test::shellWaitUntil(strCat("grep -q '", kWaitingToJoin, "2 of' log2"), 60) + "touch back";
  return spec;
}

Json expectTwoOfThreeWentOn(const Job& job) {
  EXPECT_NE(job.out.find("rc0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("rc1=0"), std::string::npos) << job.out;
  if (!job.report.contains("membership")) {
    ADD_FAILURE() << "no membership change in the report\n" << job.out;
    return Json();
  }
  const Json& change = job.report.at("membership").at(0);
  EXPECT_EQ(change.at("world_before"), 3) << change;
  EXPECT_EQ(change.at("world_after"), 2) << change;
  return change;
}

void expectTheWorkerRejoined(const Job& job, int64_t let_in_at, bool started_again) {
  for (const char* rc : {"rc0=0", "rc1=0", "rc2=0"})
    EXPECT_NE(job.out.find(rc), std::string::npos) << rc << "\n" << job.out;
  EXPECT_EQ(job.out.find("elastic: joined generation") != std::string::npos, started_again) << job.out;
  ASSERT_TRUE(job.report.contains("membership")) << job.out;
  const Json& changes = job.report.at("membership");
  ASSERT_EQ(changes.size(), 2u) << changes;
  EXPECT_EQ(changes.at(0).at("world_after"), 2) << changes;
  const Json& joined = changes.back();
  EXPECT_EQ(joined.at("world_before"), 2) << changes;
  EXPECT_EQ(joined.at("world_after"), 3) << changes;
  EXPECT_EQ(joined.at("step"), let_in_at) << changes;
  EXPECT_GT(joined.at("bytes").get<int64_t>(), kModelBytes) << joined;  // the joiner had no model
  EXPECT_EQ(job.report.value("world_size", 0), 3);
}

void expectTheRunAgainEndedOnTwoNodes(const Job& job) {
  EXPECT_NE(job.out.find("again0=0"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("again1=0"), std::string::npos) << job.out;
  ASSERT_TRUE(job.report.contains("epochs")) << job.out;
  EXPECT_EQ(job.report.at("epochs").get<double>(), 2.0);
  EXPECT_EQ(job.report.at("world_size"), 2);
  expectEachSampleOnce(job, 3 * (kBatch - 1) + 2 + 2 * (kBatch - 1) + 1);
}

}  // namespace aiacc::app::test_elastic
