// A directory of checkpoints a restarted trainer can trust (--checkpoint-dir): the bytes of each
// saved step with a manifest that proves them whole, an atomic pointer to the newest, retention of
// the newest K, and a background writer that keeps disk time off the training thread. Bytes only:
// what the bytes mean (app/checkpoint.cc serializes them) is the caller's business.
//
// On-disk layout of DIR (a step is printed with at least 12 digits, zero-padded):
//   DIR/step-000000001234.ckpt       the payload: the caller's bytes, unchanged
//   DIR/step-000000001234.manifest   five lines of text, in this order:
//                                      aiacc-checkpoint-manifest 1     (format name, version)
//                                      step 1234
//                                      payload step-000000001234.ckpt
//                                      size 4096                       (payload bytes, decimal)
//                                      crc32c 1a2b3c4d                 (8 lowercase hex digits)
//   DIR/latest                       one line: the payload's name ("step-000000001234.ckpt")
//   DIR/*.tmp.<tag>.<pid>.<tid>      a writer's temporary files (common/atomic_file.h); one left by
//                                    a killed process is ignored by readers, and removed by the next
//                                    write in its pid namespace once that process is gone
// The checksum is CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final
// xor 0xFFFFFFFF; crc32c("123456789") == 0xe3069283), computed by common/crc32c.h.
//
// Write order (CheckpointDir::write), every file through common/atomic_file.h (temporary file,
// fsync, rename, directory fsync): payload, then manifest, then `latest`, then retention deletes.
// So `latest` never names a checkpoint whose payload and manifest are not durable, and a crash at
// any point leaves the previous `latest` and its checkpoint intact. A failed write removes what
// it wrote of its own step, unless `latest` already names it or the step had files before (writing
// a step again replaces it: a failure midway leaves that step invalid, and the reader falls back
// to the one before). Retention needs room for K + 1 checkpoints: the old ones go only after the
// new one is complete. Deletions are not fsynced: after a crash an old checkpoint may reappear.
//
// Threads: CheckpointDir is used by one thread at a time, and a directory has one writer (one
// CheckpointDir or CheckpointWriter, in one process). findNewestValid may run at any time: every
// file it reads is replaced whole.
//
// May call: POSIX, the C++ standard library, common/atomic_file.h and common/error.h. No LibTorch.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/common/crc32c.h"
#include "aiacc/common/error.h"

namespace aiacc {

// Where a write is when the fault hook is called (in this order).
enum class CheckpointPhase {
  kBeforePayload,    // nothing of this step written yet
  kMidPayload,       // half of the payload is in its temporary file (not yet fsynced or renamed)
  kBeforeManifest,   // payload durable under its name, no manifest
  kBeforeLatest,     // payload and manifest durable, `latest` still names the previous checkpoint
  kBeforeRetention,  // `latest` durable and names this step; older checkpoints not yet deleted
  // CheckpointWriter only: this step's write has ended (saved or not) and the writer is idle again
  // (what it throws here is ignored). Tests wait for it instead of for a time.
  kWriterIdle,
};
const char* phaseName(CheckpointPhase phase);  // "before-payload", "mid-payload", ...

struct CheckpointDirOptions {
  // Checkpoints kept (>= 1): the one just written and the newest keep - 1 before it by step.
  // Checkpoints of later steps than the one written are left alone and not counted (an earlier
  // run's, in a folder a new run starts in; another writer's newer state).
  int keep = 3;
  // For tests: called on the writing thread at each phase of every write. It may throw (the
  // write fails as a full disk would: the exception's what() becomes the reason), block (a slow
  // disk), or never return (a process killed mid-write). Empty: no hook.
  std::function<void(CheckpointPhase phase, int64_t step)> fault_hook;
};

// What CheckpointDir::write throws when the checkpoint is whole, durable and named by `latest`, and
// only the deletion of older checkpoints failed: the step is saved (a resume finds it).
class CheckpointRetentionError : public IoError {
 public:
  using IoError::IoError;
};

struct CheckpointFile {
  std::string path;  // DIR/step-000000001234.ckpt
  int64_t step = 0;
  std::string bytes;  // the payload, checked against its manifest
};

// Writes one directory's checkpoints, synchronously, on the calling thread.
class CheckpointDir {
 public:
  // Creates `dir` (and its parents) if missing. Throws InputError for keep < 1, IoError naming
  // `dir` when it cannot be created or is not a directory.
  explicit CheckpointDir(std::string dir, CheckpointDirOptions options = {});

  // Saves `bytes` as checkpoint `step` (>= 0; an existing checkpoint of that step is replaced),
  // points `latest` at it, then deletes the older ones past CheckpointDirOptions::keep. Throws
  // IoError with a one-line what() naming the step, the file and the reason ("checkpoint step 7
  // not saved in 'DIR': cannot write 'DIR/step-000000000007.ckpt': ...: No space left on
  // device"); the previous `latest` and its checkpoint are then intact. CheckpointRetentionError
  // (an IoError, "checkpoint step 7 saved, but old checkpoints not removed: ...") when only a
  // retention delete failed: step 7 is saved. InputError for step < 0. Anything the fault hook
  // throws becomes one of these too.
  void write(int64_t step, const std::string& bytes);

  const std::string& dir() const { return dir_; }

 private:
  void writeFiles(int64_t step, const std::string& bytes);
  void removeStepUnlessLatest(int64_t step);
  void retain(int64_t newest_step);
  void hook(CheckpointPhase phase, int64_t step) const;

  std::string dir_;
  CheckpointDirOptions options_;
};

// Points DIR/latest at checkpoint `step` (written whole, as CheckpointDir::write writes it) when it
// names an older step (or nothing usable) and that step's payload and manifest are there; returns
// whether it did. Never moves `latest` back. For a process that
// finds the newest state saved by another writer after its own older write moved `latest` (the
// survivors of an elastic job saving in turn: the one exception to a directory's single writer).
// Throws IoError.
bool pointLatestAt(const std::string& dir, int64_t step);

// The steps `dir` holds a payload or a manifest of (valid or not), newest first; none when `dir`
// is missing. Throws IoError when it cannot be listed.
std::vector<int64_t> checkpointSteps(const std::string& dir);

// "step-000000001234.ckpt" and "step-000000001234.manifest".
std::string checkpointPayloadName(int64_t step);
std::string checkpointManifestName(int64_t step);

// The checkpoint to resume from: what `latest` names if it is valid, otherwise the newest valid one
// by step before it, otherwise the newest valid one after it (those are an earlier run's: see
// CheckpointDirOptions::keep), and with no usable `latest`, the newest valid one by step. Valid:
// the manifest parses, names this step and payload, and the payload has exactly the manifest's size
// and CRC-32C. Each checkpoint rejected on the way, and a missing or unusable `latest` in a
// directory that holds checkpoints, is reported as one line naming the file and why
// ("DIR/step-000000001234.ckpt: truncated: 1000 of 4096 bytes", "DIR/latest: names
// step-000000000009.ckpt which does not exist"). Temporary files are ignored. Returns nothing when
// no valid checkpoint exists, `dir` missing included (the caller reports a fresh start). Throws
// IoError when `dir` exists but cannot be listed. `report` may be empty.
// `accept` (optional) has the last word on a checkpoint that is whole: it returns "" to take it,
// or one line saying why not (the payload cannot be decoded: a damaged or crafted file whose
// manifest checks out), which is reported as "FILE: WHY" before the search goes on in the same
// order, so that --resume auto falls back to the checkpoint before an unreadable one.
std::optional<CheckpointFile> findNewestValid(
    const std::string& dir, const std::function<void(const std::string& line)>& report,
    const std::function<std::string(const CheckpointFile& file)>& accept = {});

// One failed write of a CheckpointWriter.
struct CheckpointWriteError {
  int64_t step = 0;
  // True when only the deletion of older checkpoints failed (CheckpointRetentionError): this step
  // is whole and `latest` names it. False: nothing of this step was saved; the checkpoint before it
  // stays the newest valid one.
  bool saved = false;
  std::string message;  // one line: CheckpointDir::write's what()
};

// Writes checkpoints on its own thread, at most one in flight, so that the training thread only
// hands bytes over. Failures never reach the submitting thread as exceptions: each is counted
// (failures()) and kept for takeErrors(). All methods are thread-safe.
class CheckpointWriter {
 public:
  // Creates the directory now (CheckpointDir's constructor, whose errors it throws), then the thread.
  explicit CheckpointWriter(std::string dir, CheckpointDirOptions options = {});
  // Waits for the write in flight (and one handed over but not started), then stops the thread.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Hands (step, bytes) to the writer thread and returns at once: true (bytes moved from), or
  // false when a write is in flight (counted in refused(); bytes left untouched).
  bool trySubmit(int64_t step, std::string&& bytes);
  // Waits until no write is in flight, then hands (step, bytes) over and returns without waiting
  // for this write.
  void submit(int64_t step, std::string bytes);
  // Waits until the write in flight, if any, has finished (succeeded or failed).
  void flush();
  // No write in flight now: a hint for skipping the serialization of a checkpoint trySubmit would
  // refuse (another thread may still submit first).
  bool idle() const;

  int64_t written() const;   // writes that succeeded
  int64_t failures() const;  // writes that failed (retention-only failures included)
  int64_t refused() const;   // trySubmit calls that returned false
  // The failures since the last call (the newest kMaxErrors of them), oldest first. There is no
  // callback: nothing of the caller's runs on the writer thread.
  std::vector<CheckpointWriteError> takeErrors();
  static constexpr size_t kMaxErrors = 64;

 private:
  enum class State { kIdle, kQueued, kWriting };
  struct Job {
    int64_t step = 0;
    std::string bytes;
  };
  void run();
  void handOver(std::unique_lock<std::mutex>& lock, int64_t step, std::string bytes);

  CheckpointDir store_;                                            // used by the writer thread only
  std::function<void(CheckpointPhase phase, int64_t step)> hook_;  // options.fault_hook, for kWriterIdle
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kIdle;
  bool stopping_ = false;
  Job job_;
  int64_t written_ = 0;
  int64_t failures_ = 0;
  int64_t refused_ = 0;
  std::vector<CheckpointWriteError> errors_;
  std::thread thread_;  // last: started after every member above exists
};

}  // namespace aiacc
