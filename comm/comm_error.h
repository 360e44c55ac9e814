// CommError, the error communication raises, and the reason a transport is aborted with after
// one. Included by transport.h; failure.h (which transport.h includes) needs it alone.
#pragma once

#include <exception>
#include <string>

#include "aiacc/common/error.h"

namespace aiacc::comm {

// Raised when communication fails: timeout, a peer gone, a mismatch between ranks. Messages say
// what to change in the library's terms ("the store's port", "the bucket size"); remedy() names
// that setting for a program that wants to add the name of its own option for it.
class CommError : public Error {
 public:
  enum class Remedy {
    kNone,
    kStore,         // the rendezvous store's address or port, or the job id (StoreOptions)
    kBucketSize,    // the bucket size (ReducerOptions::bucket_mb; a Reducer without DataParallel's check)
    kModel,         // the model (its parameters) on every rank
    kSharedMemory,  // shared memory between the ranks of a host (TransportSpec::shm)
    kMembership,    // an elastic job's MIN:MAX or its rendezvous timeout (MembershipOptions)
  };
  explicit CommError(const std::string& what, Remedy remedy = Remedy::kNone) : Error(what), remedy_(remedy) {}
  Remedy remedy() const { return remedy_; }

 private:
  Remedy remedy_;
};

// What a transport is aborted with once a failure is known (`first`, in one line): a part that
// sees an operation fail aborts its transports before it waits for anything else, so the
// operations still queued or running (on any channel) fail at once instead of each waiting out
// its timeout.
inline std::string abortReason(const std::string& first) {
  return "aborted after an earlier failure: " + firstLine(first);
}
inline std::string abortReason(const std::exception& first) { return abortReason(first.what()); }

}  // namespace aiacc::comm
