#include "tests/elastic_threads.h"

#include <glog/logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <gtest/gtest.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "aiacc/comm/store.h"
#include "app/elastic.h"
#include "app/exit_code.h"
#include "app/sync_factory.h"
#include "app/test_hooks.h"
#include "app/trainer.h"
#include "app/worker_end.h"

namespace aiacc::test_threads {

// Every line glog writes while the job runs (all threads: glog's sinks are process-wide).
class LineSink : public google::LogSink {
 public:
  using google::LogSink::send;
  void send(google::LogSeverity, const char*, const char* base_filename, int line, const struct ::tm*,
            const char* message, size_t message_len) override {
    std::lock_guard<std::mutex> lock(mutex_);
    lines_.push_back(std::string(base_filename) + ":" + std::to_string(line) + "] " +
                     std::string(message, message_len));
  }
  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

struct ThreadJob::Shared {
  ThreadJobSpec spec;
  LineSink sink;
  std::mutex mutex;
  std::condition_variable ended_cv;
  std::vector<std::optional<RankEnd>> ends;
  std::vector<std::thread> threads;
};

app::Config ThreadJobSpec::smallConfig() {
  app::Config c;
  c.data = "synthetic";
  c.synthetic_images = 48;  // 16 per rank at 3 ranks: 4 steps of 4
  c.synthetic_classes = 4;
  c.arch = "resnet18-w8";
  c.epochs = 2;
  c.stages = {app::Stage{0, 16, 4, 0.08}};
  c.warmup_epochs = 0;
  c.threads = 1;
  c.progress_seconds = 1e9;
  return c;
}

namespace {

// One rank, as runWorker runs a worker of an elastic job (app/command_train.cc): join, train,
// end by endOfRun; an error said in the store (markFailed) and ended with exit 1.
RankEnd runRank(const ThreadJobSpec& spec, int rank, const c10::intrusive_ptr<c10d::Store>& store,
                const std::shared_ptr<aiacc::test::ManualClock>& clock) {
  RankEnd end;
  std::ostringstream out, err;
  std::shared_ptr<app::ElasticJob> elastic;
  try {
    app::ElasticOptions o;
    o.membership.min = spec.min;
    o.membership.max = spec.max;
    o.membership.timeout = spec.rdzv_timeout;
    o.membership.last_call = spec.last_call;
    o.membership.clock = clock;
    o.node = "threads";  // one host: the ranks' transports over shared memory
    o.launch_rank = rank;
    app::SyncFactorySpec sync;
    // (The job's keys under the prefix the transports' are under, as makeElasticJob's store has them.)
    auto job = std::make_shared<app::ElasticJob>(c10::make_intrusive<c10d::PrefixStore>(sync.address.key_prefix, store),
                                                 o);
    if (std::optional<comm::JobEnded> ended = job->start()) {
      end.code = app::endedWithoutThisProcess(*ended, err);
      end.err = err.str();
      return end;
    }
    elastic = std::move(job);
    const comm::WorldInfo world = elastic->generation().world();
    sync.launched = world;
    sync.elastic = elastic;
    sync.shared_store = store;
    app::Trainer trainer(spec.config, world, app::makeSyncFactory(std::move(sync)), std::chrono::steady_clock::now());
    trainer.setElastic(elastic);
    const std::map<std::string, std::string> env = spec.env ? spec.env(rank) : std::map<std::string, std::string>{};
    trainer.setTestHooks(app::testHooksFromEnvironment([&env](const char* name) -> const char* {
      const auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    }));
    end.report = trainer.run();
    end.code = app::endOfRun(*end.report, spec.config, elastic.get(), rank, out, err);
  } catch (...) {  // (the Trainer is gone: its transports closed)
    end.code = app::endWithError(std::current_exception(), elastic.get(), err);
    end.error = err.str();
  }
  end.out = out.str();
  end.err = err.str();
  return end;
}

}  // namespace

ThreadJob::ThreadJob(ThreadJobSpec spec)
    : clock_(std::make_shared<aiacc::test::ManualClock>()), store_(comm::makeHashStore()),
      shared_(std::make_shared<Shared>()) {
  shared_->spec = std::move(spec);
  shared_->ends.resize(static_cast<size_t>(shared_->spec.ranks));
  google::AddLogSink(&shared_->sink);
  for (int r = 0; r < shared_->spec.ranks; ++r) {
    shared_->threads.emplace_back([shared = shared_, r, store = store_, clock = clock_] {
      RankEnd end = runRank(shared->spec, r, store, clock);
      {
        std::lock_guard<std::mutex> lock(shared->mutex);
        shared->ends[static_cast<size_t>(r)] = std::move(end);
      }
      shared->ended_cv.notify_all();
    });
  }
}

ThreadJob::~ThreadJob() {
  for (std::thread& t : shared_->threads) {
    if (t.joinable()) t.join();
  }
  google::RemoveLogSink(&shared_->sink);
}

bool ThreadJob::awaitEnd(int rank, std::chrono::seconds limit) {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  const bool ended = shared_->ended_cv.wait_for(lock, limit,
                                                [&] { return shared_->ends[static_cast<size_t>(rank)].has_value(); });
  clock_->advance(std::chrono::milliseconds(0));  // (the test goes on: the clock's watchdog counts from here)
  return ended;
}

std::vector<RankEnd> ThreadJob::wait(std::chrono::seconds limit) {
  std::vector<RankEnd> ends;
  for (int r = 0; r < shared_->spec.ranks; ++r) {
    EXPECT_TRUE(awaitEnd(r, limit)) << "rank " << r << " still runs after " << limit.count() << " s";
  }
  for (std::thread& t : shared_->threads) {
    if (t.joinable()) t.join();
  }
  for (const std::optional<RankEnd>& e : shared_->ends) ends.push_back(e ? *e : RankEnd{});
  return ends;
}

std::vector<std::string> ThreadJob::logLines() const { return shared_->sink.lines(); }

int countContaining(const std::vector<std::string>& lines, const std::string& text) {
  int n = 0;
  for (const std::string& l : lines) n += l.find(text) != std::string::npos ? 1 : 0;
  return n;
}

}  // namespace aiacc::test_threads
