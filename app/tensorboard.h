// A TensorBoard event file writer: scalars and text (Markdown) summaries that TensorBoard shows
// while training runs, written without TensorFlow or a protobuf library.
//
// The file: DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid>.aiacc (TensorBoard reads
// every file whose name holds "tfevents"; a name already taken gets aiacc2, aiacc3, ... instead).
// It is a sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data (length bytes) |
//   uint32 masked CRC-32C of data
// (masks and CRC in common/crc32c.h, little-endian), whose data is a serialized tensorflow Event
// (tensorboard/compat/proto/event.proto):
//   first record  Event{wall_time, file_version: "brain.Event:2"}
//   scalar()      Event{wall_time, step, summary: Summary{value: [Value{tag, simple_value (float)}]}}
//   text()        Event{wall_time, step, summary: Summary{value: [Value{tag,
//                   metadata: SummaryMetadata{plugin_data: {plugin_name: "text"}},
//                   tensor: TensorProto{dtype: DT_STRING, tensor_shape: {} (a scalar),
//                                       string_val: [the UTF-8 bytes]}}]}}
// the same messages tf.summary.scalar (v1) and tf.summary.text write, so TensorBoard's scalar
// charts and text dashboard (which renders a scalar string as Markdown) show them.
//
// Records go to a buffered FILE*: a reader sees them all after flush(); earlier ones reach the
// file as the buffer fills, maybe ending in a partial record, which TensorBoard's reader waits on.
//
// Errors: every failure (the folder cannot be created, the file cannot be created, a write, flush
// or close fails, e.g. disk full) throws an aiacc::IoError whose one-line what() names the file
// or folder and strerror ("cannot write TensorBoard file '/runs/x/events...': No space left on
// device"). After a failed write the file may end in a partial record, so every later call throws
// the same error again; nothing is dropped silently. The destructor closes the file and cannot
// throw: a failure there is logged (glog ERROR); call close() first to have it thrown.
//
// Threads: one thread at a time per writer (no internal lock). Two writers never share a file.
//
// May call: POSIX, the C++ standard library, glog, common/crc32c.h and common/error.h.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace aiacc::app {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents, like mkdir -p) if missing, creates a new event file in it and
  // writes the first record, with `start_wall_time` (seconds since the Unix epoch; its integer part
  // also names the file). Throws IoError when the folder or file cannot be created or written.
  explicit TensorBoardWriter(const std::string& dir, double start_wall_time = now());
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Seconds since the Unix epoch, with microseconds: the wall_time to pass below.
  static double now();

  // One point of the scalar chart `tag` ("loss/train", "lr"): `value` is stored as a float
  // (TensorBoard's simple_value), NaN and infinities included. Steps need not be consecutive.
  void scalar(const std::string& tag, double value, int64_t step, double wall_time);

  // A text summary under `tag`: `markdown` (UTF-8) is shown in the Text dashboard, rendered as
  // Markdown (headings, lists, tables, **bold**; raw HTML is escaped by TensorBoard).
  void text(const std::string& tag, const std::string& markdown, int64_t step, double wall_time);

  // Makes every record written so far visible to readers (fflush; not fsync).
  void flush();

  // Flushes and closes the file; scalar(), text() and flush() throw after it. Calling it again does
  // nothing, except after a failure, which every call throws again.
  void close();

  // The event file's path (DIR/events.out.tfevents....).
  const std::string& path() const { return path_; }

 private:
  void writeRecord(const std::string& data);
  void checkUsable() const;
  [[noreturn]] void fail(const std::string& what, int err);

  std::string path_;
  FILE* file_ = nullptr;
  std::string error_;  // the first failure, thrown again by every later call
};

}  // namespace aiacc::app
