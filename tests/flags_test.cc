// aiacc_train's flags: names with hyphens, recipes and the command line, AIACC_* variables,
// typed options parsed from their names, the library's defaults, and errors naming flags.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"
#include "app/cli.h"
#include "app/config.h"
#include "app/flags.h"
#include "app/job_settings.h"
#include "app/option_names.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

TEST(Flags, HyphensBecomeUnderscores) {
  const char* argv[] = {"prog", "--batch-size=8", "--warmup-epochs", "3", "--data=/a-b/c-d"};
  auto out = normalizeFlagNames(5, const_cast<char**>(argv));
  EXPECT_EQ(out[1], "--batch_size=8");
  EXPECT_EQ(out[2], "--warmup_epochs");
  EXPECT_EQ(out[3], "3");
  EXPECT_EQ(out[4], "--data=/a-b/c-d");  // values untouched
}

TEST(Flags, RecipeSetsDefaultsAndCommandLineWins) {
  gflags::FlagSaver saver;
  test::TempDir d;
  test::writeText(d / "r.recipe", "# comment\narch = resnet18\nlr = 0.5   # trailing comment\nnesterov = true\n"
                                  "stage 0 size=96 batch=16 scale=0.35\nstage 3 size=128 batch=8\n");
  gflags::SetCommandLineOption("epochs", "7");  // as if given on the command line
  gflags::SetCommandLineOption("recipe", (d / "r.recipe").c_str());
  Config c = configFromFlags(applyRecipeFlag());
  EXPECT_EQ(c.arch, "resnet18");
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_TRUE(c.nesterov);
  EXPECT_EQ(c.epochs, 7);
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_EQ(c.stages[0].image_size, 96);
  EXPECT_DOUBLE_EQ(c.stages[0].scale_min, 0.35);
  EXPECT_EQ(c.stages[1].batch_size, 8);
  EXPECT_NE(c.recipe_text.find("stage 3"), std::string::npos);

  test::writeText(d / "bad.recipe", "arch = resnet18\nbogus-key = 1\n");
  try {
    applyRecipe(d / "bad.recipe", nullptr);
    FAIL() << "unknown key accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.recipe:2"), std::string::npos) << e.what();
  }
}

// Distribution keys in a recipe shape the distribution options (the recipe is applied before
// they are built), and the command line still wins over them.
TEST(Flags, RecipeDistributionKeysReachTheDistSpec) {
  gflags::FlagSaver saver;
  test::TempDir d;
  test::writeText(d / "dist.recipe",
                  "nproc = 3\nbucket-mb = 7\nallreduce-dtype = bf16\nstreams = 2\nbn-sync = broadcast\n"
                  "comm-timeout = 9\ntimeline = /tmp/t.json\nhierarchical = off\n");
  gflags::SetCommandLineOption("streams", "4");  // as if given on the command line
  gflags::SetCommandLineOption("recipe", (d / "dist.recipe").c_str());
  const Recipe recipe = applyRecipeFlag();
  const DistSpec dist = distSpecFromFlags({});
  EXPECT_EQ(dist.launch.nproc, 3);
  EXPECT_FALSE(dist.launch_flags.nproc.has_value()) << "a recipe value is a default, not a command-line flag";
  EXPECT_DOUBLE_EQ(dist.dp.reducer.bucket_mb, 7);
  EXPECT_DOUBLE_EQ(distSpecFromFlags({{"AIACC_BUCKET_MB", "3"}}).dp.reducer.bucket_mb, 3)
      << "a recipe's values are defaults: an AIACC_* variable overrides them";
  EXPECT_STREQ(optionName(dist.dp.codec.dtype), "bf16");
  EXPECT_EQ(dist.streams, 4) << "the command line wins";
  EXPECT_STREQ(optionName(dist.dp.buffers), "broadcast");
  EXPECT_DOUBLE_EQ(dist.timeout_s, 9);
  EXPECT_EQ(dist.timeline, "/tmp/t.json");
  EXPECT_STREQ(optionName(dist.hierarchical), "off");
  EXPECT_EQ(configFromFlags(recipe).recipe, d / "dist.recipe");
}

// The AIACC_* variables fill the same DataParallelOptions as the flags: a variable applies where
// the command line did not give its flag; a flag given wins; a bad value is one line.
TEST(Flags, AiaccVariablesFillWhatTheFlagsLeft) {
  gflags::FlagSaver saver;
  const comm::EnvMap env = {{"AIACC_BUCKET_MB", "3"},
                            {"AIACC_ALLREDUCE_DTYPE", "bf16"},
                            {"AIACC_STREAMS", "2"},
                            {"AIACC_FIRST_BUCKET_MB", "0.5"},
                            {"AIACC_AUTOTUNE", "0"}};
  DistSpec dist = distSpecFromFlags(env);
  EXPECT_DOUBLE_EQ(dist.dp.reducer.bucket_mb, 3);
  EXPECT_DOUBLE_EQ(dist.dp.reducer.first_bucket_mb, 0.5);
  EXPECT_EQ(dist.dp.codec.dtype, comm::TransferDtype::kBFloat16);
  EXPECT_FALSE(dist.dp.autotune);
  EXPECT_EQ(dist.streams, 2);
  EXPECT_EQ(dist.dp.striping.channels, 2);
  EXPECT_TRUE(dist.dp.tune.channels.empty()) << "a stream count given is not tuned";
  gflags::SetCommandLineOption("bucket_mb", "7");
  gflags::SetCommandLineOption("streams", "auto");  // given: wins over AIACC_STREAMS
  gflags::SetCommandLineOption("autotune", "true");
  dist = distSpecFromFlags(env);
  EXPECT_DOUBLE_EQ(dist.dp.reducer.bucket_mb, 7);
  EXPECT_EQ(dist.dp.codec.dtype, comm::TransferDtype::kBFloat16);
  EXPECT_EQ(dist.streams, 0);
  EXPECT_EQ(dist.dp.striping.channels, 1) << "the tuner starts from one channel";
  EXPECT_EQ(dist.dp.tune.channels, (std::vector<int>{2, 4}));
  // Without variables, aiacc_train's defaults.
  const DistSpec plain = distSpecFromFlags({});
  EXPECT_EQ(plain.dp.codec.dtype, comm::CodecOptions{}.dtype);
  EXPECT_EQ(plain.dp.tune.bucket_mb, defaultDataParallelOptions().tune.bucket_mb);
  try {
    distSpecFromFlags({{"AIACC_BN_SYNC", "often"}});
    ADD_FAILURE() << "AIACC_BN_SYNC=often was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("AIACC_BN_SYNC='often': must be lazy, average, broadcast or none", 0), 0u)
        << e.what();
  }
}

// Each typed option parses from its flag's names, once, and gives the same name back (the
// agreement settings print it); a bad value is one line naming the flag and the allowed values.
TEST(Flags, TypedOptionsParseFromTheirNames) {
  for (auto v : {comm::TransferDtype::kFloat32, comm::TransferDtype::kFloat16, comm::TransferDtype::kBFloat16}) {
    EXPECT_EQ(optionFromName<comm::TransferDtype>(optionName(v)), v);
  }
  for (auto v : {comm::BufferSync::kAverageWhenRead, comm::BufferSync::kAverage, comm::BufferSync::kBroadcast,
                 comm::BufferSync::kNone}) {
    EXPECT_EQ(optionFromName<comm::BufferSync>(optionName(v)), v);
  }
  for (auto v : {comm::TwoLevelMode::kOn, comm::TwoLevelMode::kOff, comm::TwoLevelMode::kAuto}) {
    EXPECT_EQ(optionFromName<comm::TwoLevelMode>(optionName(v)), v);
  }
  for (auto v : {LrSchedule::kCosine, LrSchedule::kStep, LrSchedule::kLinear}) {
    EXPECT_EQ(optionFromName<LrSchedule>(optionName(v)), v);
  }
  EXPECT_STREQ(optionName(comm::BufferSync::kAverageWhenRead), "lazy");
  EXPECT_STREQ(optionName(AmpDtype::kBf16), "bf16");
  EXPECT_FALSE(optionFromName<comm::TransferDtype>("fp8").has_value());
  EXPECT_EQ(optionNames<AmpDtype>("auto"), "fp16, bf16 or auto");

  gflags::FlagSaver saver;
  gflags::SetCommandLineOption("allreduce_dtype", "fp16");
  gflags::SetCommandLineOption("bn_sync", "none");
  gflags::SetCommandLineOption("hierarchical", "on");
  const DistSpec dist = distSpecFromFlags({});
  EXPECT_EQ(dist.dp.codec.dtype, comm::TransferDtype::kFloat16);
  EXPECT_EQ(dist.dp.buffers, comm::BufferSync::kNone);
  EXPECT_EQ(dist.hierarchical, comm::TwoLevelMode::kOn);
  const comm::Settings settings = distSettings(dist, comm::WorldInfo{0, 2, 0, 2});
  auto value = [&](const std::string& name) {
    for (const comm::Setting& x : settings) {
      if (x.name == name) return x.value;
    }
    return std::string("(missing)");
  };
  EXPECT_EQ(value("--allreduce-dtype"), "fp16");
  EXPECT_EQ(value("--bn-sync"), "none");
  EXPECT_EQ(value("--hierarchical"), "on");

  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  gflags::SetCommandLineOption("bn_sync", "sometimes");
  EXPECT_EQ(message([] { distSpecFromFlags({}); }),
            "--bn-sync must be lazy, average, broadcast or none (got 'sometimes')");
  gflags::SetCommandLineOption("bn_sync", "lazy");
  gflags::SetCommandLineOption("hierarchical", "maybe");
  EXPECT_EQ(message([] { distSpecFromFlags({}); }), "--hierarchical must be on, off or auto (got 'maybe')");
  gflags::SetCommandLineOption("hierarchical", "auto");
  gflags::SetCommandLineOption("allreduce_dtype", "fp8");
  EXPECT_EQ(message([] { distSpecFromFlags({}); }), "--allreduce-dtype must be fp32, fp16 or bf16 (got 'fp8')");

  EXPECT_EQ(configFromFlags(Recipe{}).amp_dtype, AmpDtype::kBf16) << "auto on the CPU";
  gflags::SetCommandLineOption("amp_dtype", "fp8");
  EXPECT_EQ(message([] { configFromFlags(Recipe{}); }), "--amp-dtype must be fp16, bf16 or auto (got 'fp8')");
  gflags::SetCommandLineOption("amp_dtype", "bf16");
  gflags::SetCommandLineOption("lr_schedule", "step");
  const Config c = configFromFlags(Recipe{});
  EXPECT_EQ(c.amp_dtype, AmpDtype::kBf16);
  EXPECT_EQ(c.lr_schedule, LrSchedule::kStep);
  gflags::SetCommandLineOption("lr_schedule", "wavy");
  EXPECT_EQ(message([] { configFromFlags(Recipe{}); }), "--lr-schedule must be cosine, step or linear (got 'wavy')");
}

// One default per setting: aiacc_train's flags default to the library's constants, and so do
// the library's option structs and the DistSpec built from the flags.
TEST(Flags, DefaultsAreTheLibrarysDefaults) {
  auto flagDefault = [](const char* name) {
    gflags::CommandLineFlagInfo info;
    EXPECT_TRUE(gflags::GetCommandLineFlagInfo(name, &info)) << name;
    return info.default_value;
  };
  EXPECT_DOUBLE_EQ(std::stod(flagDefault("comm_timeout")) * 1000.0, static_cast<double>(comm::kDefaultTimeout.count()));
  EXPECT_EQ(optionFromName<comm::BufferSync>(flagDefault("bn_sync")), comm::kDefaultBufferSync);
  EXPECT_DOUBLE_EQ(std::stod(flagDefault("bucket_mb")), comm::kDefaultBucketMb);
  const DistSpec d;
  EXPECT_DOUBLE_EQ(d.timeout_s * 1000.0, static_cast<double>(comm::kDefaultTimeout.count()));
  EXPECT_EQ(d.dp.buffers, comm::kDefaultBufferSync);
  EXPECT_DOUBLE_EQ(d.dp.reducer.bucket_mb, comm::kDefaultBucketMb);
  const comm::DataParallelOptions o;
  EXPECT_EQ(o.buffers, comm::kDefaultBufferSync);
  EXPECT_DOUBLE_EQ(o.reducer.bucket_mb, comm::kDefaultBucketMb);
  EXPECT_EQ(comm::ReducerOptions{}.bucket_mb, comm::kDefaultBucketMb);
  EXPECT_EQ(comm::TransportSpec{}.timeout, comm::kDefaultTimeout);
  EXPECT_EQ(comm::StoreOptions{}.timeout, comm::kDefaultTimeout);
  EXPECT_EQ(comm::GlooOptions{}.timeout, comm::kDefaultTimeout);
  EXPECT_EQ(comm::ShmOptions{}.timeout, comm::kDefaultTimeout);
}

// comm's errors name what to change in the library's words; aiacc_train adds its flag for it.
TEST(Flags, CommErrorsGetTheFlagForWhatTheyNameToChange) {
  using R = comm::CommError::Remedy;
  EXPECT_EQ(flagHint(R::kNone), "");
  EXPECT_EQ(flagHint(R::kBucketSize), " (aiacc_train: --bucket-mb)");
  EXPECT_EQ(flagHint(R::kSharedMemory), " (aiacc_train: --noshm)");
  EXPECT_NE(flagHint(R::kStore).find("--master HOST:PORT"), std::string::npos);
  EXPECT_NE(flagHint(R::kStore).find("--job-id"), std::string::npos);
  EXPECT_NE(flagHint(R::kModel).find("--arch"), std::string::npos);
  // The library's own message names no flag of ours.
  auto store = comm::makeHashStore();
  try {
    comm::claimForJob(*store, "job-a", "h:1");
    comm::claimForJob(*store, "job-b", "h:1");
    FAIL() << "a second job was accepted";
  } catch (const comm::CommError& e) {
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
    EXPECT_EQ(e.remedy(), R::kStore);
  }
}

TEST(Flags, ShippedRecipesParse) {
  for (const char* r : {"cpu_sample.recipe", "dawnbench_8gpu.recipe"}) {
    gflags::FlagSaver saver;
    // Appended in place: GCC 12 misreads the inlined `a + "/recipes/" + r` as an out-of-bounds
    // copy (-Warray-bounds, a known false positive) once this file shares a unit with others.
    std::string path = test::sourceDir();
    path.append("/recipes/").append(r);
    gflags::SetCommandLineOption("recipe", path.c_str());
    Config c = configFromFlags(applyRecipeFlag());
    EXPECT_GE(c.stages.size(), 2u) << r;
  }
}

TEST(Flags, DawnbenchRecipeIsThePublishedSchedule) {
  gflags::FlagSaver saver;
  gflags::SetCommandLineOption("recipe", (test::sourceDir() + "/recipes/dawnbench_8gpu.recipe").c_str());
  Config c = configFromFlags(applyRecipeFlag());
  EXPECT_EQ(c.epochs, 21);
  EXPECT_EQ(stageAt(c, 0).image_size, 96);
  EXPECT_EQ(stageAt(c, 12).image_size, 128);
  EXPECT_EQ(stageAt(c, 18).image_size, 224);
  EXPECT_EQ(stageAt(c, 20).image_size, 288);
  EXPECT_DOUBLE_EQ(stageAt(c, 20).scale_min, 0.5);
  EXPECT_EQ(stageAt(c, 0).batch_size * 8, 2048);
  EXPECT_EQ(stageAt(c, 20).batch_size * 8, 1024);
  EXPECT_NEAR(learningRate(c, 5.0, 2048), 1.2, 1e-9);  // peak after 5 warmup epochs, 8 GPUs
  EXPECT_STREQ(optionName(c.lr_schedule), "linear");
  EXPECT_TRUE(c.nesterov);
  EXPECT_GT(c.label_smoothing, 0);
}

// A run shorter than the default warmup (2 epochs, or a recipe's) warms up for the whole run, so
// `--epochs 1` works as given; a warmup given on the command line must fit in the run.
TEST(Flags, DefaultWarmupIsCutToAShortRun) {
  gflags::FlagSaver saver;
  gflags::SetCommandLineOption("epochs", "1");
  EXPECT_EQ(configFromFlags(Recipe{}).warmup_epochs, 1.0);
  gflags::SetCommandLineOption("epochs", "3");
  EXPECT_EQ(configFromFlags(Recipe{}).warmup_epochs, 2.0) << "the default itself when it fits";
  gflags::SetCommandLineOption("epochs", "1");
  gflags::SetCommandLineOption("warmup_epochs", "2");
  EXPECT_THROW(configFromFlags(Recipe{}), InputError);
}

}  // namespace
}  // namespace aiacc::app
