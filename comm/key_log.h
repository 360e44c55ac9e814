// The keys a process wrote to the rendezvous store, so that it can delete them once nobody reads
// them any more: an elastic job's generation (comm/membership.h) makes its transports and its
// agreement under its own key prefix, and after the next generation has formed those keys are
// dead weight on the store's host (a few hundred bytes per rank per generation, for the life of
// a job that may regroup thousands of times).
//
// c10d's stores cannot list keys in LibTorch 1.13, so the writer keeps the names: a KeyLog given
// to StoreOptions::key_log (comm/store.h) records every key written through that store (set,
// compareSet, add, and in LibTorch 2.x append and multiSet), also by the libraries on top of it
// (ProcessGroupGloo's and ProcessGroupNCCL's rendezvous). A process that dies cannot delete its
// keys: each one publishes its list (publish) once its set-up is done, and a survivor deletes a
// lost rank's keys from that list (deleteKeysOf). Keys written after publish (ProcessGroupNCCL's
// error propagation, through a clone of the store) are not in the published list; a live
// process still deletes them (deleteOwn).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace aiacc::comm {

class KeyLog {
 public:
  // Records `key` (as named to the recording store, under its prefix); each key once.
  void add(const std::string& key);
  // The keys recorded so far, in the order first written.
  std::vector<std::string> keys() const;

  // Sets `list_key` on `store` to the keys recorded so far, one per line. `store` and the
  // recording store share a prefix, so that deleteKeysOf can delete them through `store`.
  void publish(c10d::Store& store, const std::string& list_key) const;
  // Deletes this process's keys, and the published list at `list_key`; returns how many keys
  // were deleted.
  int64_t deleteOwn(c10d::Store& store, const std::string& list_key) const;
  // Deletes the keys another process published at `list_key` (a lost rank), and the list;
  // returns how many were deleted (0 when it published none).
  static int64_t deleteKeysOf(c10d::Store& store, const std::string& list_key);

 private:
  mutable std::mutex mu_;
  std::vector<std::string> keys_;
  std::unordered_set<std::string> seen_;
};

// A PrefixStore (`prefix`/key on `store`) that also records in `log` every key written through
// it.
c10::intrusive_ptr<c10d::Store> makeRecordingPrefixStore(const std::string& prefix,
                                                         c10::intrusive_ptr<c10d::Store> store,
                                                         std::shared_ptr<KeyLog> log);

}  // namespace aiacc::comm
