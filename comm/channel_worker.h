// ChannelWorker: the thread behind one communication channel. Jobs run in submission order (so
// every rank issues a channel's collectives in the same order); each job's completion and error
// reach the caller through a Work (the error as a Failure, failure.h); bytes and busy seconds are
// counted per channel, and each job becomes a timeline span when a timeline is given. Used by
// every CPU transport.
//
// Errors are sticky: after the first job that fails (a timeout, a dead peer) or abort(), every
// queued and every later job fails at once with that first error instead of waiting out its own
// timeout, so a job with a dead rank ends within one timeout whatever is queued.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "aiacc/common/error.h"
#include "aiacc/comm/failure.h"
#include "aiacc/comm/timeline.h"
#include "aiacc/comm/transport.h"

namespace aiacc::comm {

// The CPU transports' precondition on every tensor they are given: contiguous, in host memory.
inline void checkContiguousCpu(const at::Tensor& t, const char* what) {
  AIACC_CHECK(t.is_contiguous() && t.device().is_cpu(), what, " needs a contiguous CPU tensor");
}

// wait() blocks until the job ended and raises its error, every time it is called (a second
// wait() after an error is not a success).
class CompletionWork : public Work {
 public:
  explicit CompletionWork(std::shared_ptr<Completion> c) : c_(std::move(c)) {}
  void wait() override {
    if (Failure f = c_->wait()) f.raise();
  }
  Failure failure() const override { return c_->peek(); }

 private:
  std::shared_ptr<Completion> c_;
};

// Code a transport runs on the worker's own thread: on_start before the first job, on_exit after
// the last; neither may throw. ShmTransport holds its liveness lock there, so the lock lives exactly as long as the
// thread that runs the channel's collectives (a process that dies releases it at once).
struct ThreadHooks {
  std::function<void()> on_start;
  std::function<void()> on_exit;
};

class ChannelWorker {
 public:
  explicit ChannelWorker(std::shared_ptr<Timeline> timeline = nullptr, int row = 0, ThreadHooks hooks = {})
      : timeline_(std::move(timeline)), row_(row), hooks_(std::move(hooks)), thread_([this] { run(); }) {}
  ~ChannelWorker() { shutdown(); }
  ChannelWorker(const ChannelWorker&) = delete;
  ChannelWorker& operator=(const ChannelWorker&) = delete;

  // Runs what is queued, then stops the thread. Idempotent; owners whose jobs use resources
  // they free in their destructor call it first.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  ChannelStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  // Fails every queued and later job with `why` (unless an earlier error came first). The job
  // running now finishes or fails on its own (within its timeout), or sooner where it polls
  // firstError() (shared memory's barrier does, through its own abort flag).
  void abort(const std::string& why) { fail(Failure::comm(why)); }

  // The first error, or none.
  Failure firstError() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

  std::shared_ptr<Work> submit(const char* what, size_t bytes, std::function<void()> job) {
    auto done = std::make_shared<Completion>();
    auto run = [this, what, bytes, job = std::move(job), done] {
      if (Failure f = firstError()) return done->finish(std::move(f));
      const auto t0 = std::chrono::steady_clock::now();
      try {
        job();
      } catch (...) {
        Failure f = Failure::current();
        fail(f);
        return done->finish(std::move(f));
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (timeline_) timeline_->span(what, row_, t0, t1, {{"bytes", static_cast<int64_t>(bytes)}});
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.bytes += static_cast<double>(bytes);
        stats_.busy_s += std::chrono::duration<double>(t1 - t0).count();
      }
      done->finish(Failure());
    };
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(run));
    }
    cv_.notify_one();
    return std::make_shared<CompletionWork>(std::move(done));
  }

 private:
  void fail(Failure f) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_error_) first_error_ = std::move(f);
  }

  void run() {
    if (hooks_.on_start) hooks_.on_start();
    loop();
    if (hooks_.on_exit) hooks_.on_exit();
  }

  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop requested and nothing left
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  std::shared_ptr<Timeline> timeline_;
  int row_;
  ThreadHooks hooks_;
  mutable std::mutex mu_;
  ChannelStats stats_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  Failure first_error_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace aiacc::comm
