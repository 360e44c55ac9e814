// Failure: an error held as a value, for handing it from the thread that caught it (a channel
// worker, a relay) to the threads that wait for the work.
//
// Why not std::exception_ptr: it shares one exception object between the threads, reference-
// counted inside libstdc++, and std::runtime_error's message is a reference-counted string there
// too. The object then dies in whichever thread drops the last reference, ordered after a
// waiter's what() only by counters compiled into libstdc++, which ThreadSanitizer cannot see: a
// worker dropping the last copy while the waiter reads it is reported as a race (CI's tsan run:
// AbortBeforeWait.TwoLevelStagesAbortWhenOneFails). A Failure holds plain strings, copied under
// the owner's lock like any other shared state, and raise() throws a new exception every time,
// owned by the thread that raised it.
//
// The kind survives (CommError with its remedy, InputError, IoError); any other exception
// becomes an aiacc::Error with the same message.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>

#include "aiacc/comm/comm_error.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {

class Failure {
 public:
  Failure() = default;  // no failure

  // The exception being handled: call inside a catch block.
  static Failure current() {
    try {
      throw;
    } catch (const CommError& e) {
      return Failure(Kind::kComm, e.what(), e.remedy());
    } catch (const InputError& e) {
      return Failure(Kind::kInput, e.what());
    } catch (const IoError& e) {
      return Failure(Kind::kIo, e.what());
    } catch (const std::exception& e) {  // a dependency's: its first line (LibTorch's go on with a backtrace)
      return Failure(Kind::kError, firstLine(e.what()));
    } catch (...) {
      return Failure(Kind::kError, "unknown exception (not a std::exception)");
    }
  }
  static Failure comm(std::string what, CommError::Remedy remedy = CommError::Remedy::kNone) {
    return Failure(Kind::kComm, std::move(what), remedy);
  }

  explicit operator bool() const { return kind_ != Kind::kNone; }
  const std::string& what() const { return what_; }

  // Throws a new exception of the kind caught, with its message.
  [[noreturn]] void raise() const {
    switch (kind_) {
      case Kind::kComm: throw CommError(what_, remedy_);
      case Kind::kInput: throw InputError(what_);
      case Kind::kIo: throw IoError(what_);
      case Kind::kError:
      case Kind::kNone:  // a caller's bug: raising no failure
        break;
    }
    throw Error(kind_ == Kind::kNone ? "internal error: raised an empty comm::Failure" : what_);
  }

 private:
  enum class Kind { kNone, kComm, kInput, kIo, kError };
  Failure(Kind kind, std::string what, CommError::Remedy remedy = CommError::Remedy::kNone)
      : kind_(kind), what_(std::move(what)), remedy_(remedy) {}

  Kind kind_ = Kind::kNone;
  std::string what_;
  CommError::Remedy remedy_ = CommError::Remedy::kNone;
};

// The end of one piece of work, shared by the thread that does it and those that wait for it:
// finish() once; wait() blocks until then and returns the failure (none on success). What the
// worker wrote before finish() is visible to a thread after its wait().
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Failure failure;

  void finish(Failure f) {
    {
      std::lock_guard<std::mutex> lock(mu);
      failure = std::move(f);
      done = true;
    }
    cv.notify_all();
  }
  // Without blocking: the failure it finished with (none while it runs, or after a success).
  Failure peek() {
    std::lock_guard<std::mutex> lock(mu);
    return done ? failure : Failure();
  }
  // Without blocking: finished.
  bool finished() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  Failure wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return failure;
  }
};

}  // namespace aiacc::comm
