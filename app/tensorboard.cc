#include "app/tensorboard.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "aiacc/common/crc32c.h"
#include "aiacc/common/error.h"

namespace aiacc::app {
namespace {

// ---- Protocol buffer encoding, the subset the Event messages need.
// A field is a key, varint(field_number << 3 | wire_type), then its value: a varint (int64, enum),
// 8 or 4 little-endian bytes (double, float), or varint(length) and the bytes (string, bytes, an
// embedded message). Fields are written in field number order, as protobuf's serializers do.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void putVarint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
}

void putKey(std::string& out, uint32_t field, WireType type) { putVarint(out, uint64_t{field} << 3 | type); }

void putLittleEndian(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void putDouble(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, kFixed64);
  putLittleEndian(out, bits, 8);
}

void putFloat(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, kFixed32);
  putLittleEndian(out, bits, 4);
}

// int64 and enum fields: a negative value is the 10-byte varint of its two's complement.
void putInt64(std::string& out, uint32_t field, int64_t v) {
  putKey(out, field, kVarint);
  putVarint(out, static_cast<uint64_t>(v));
}

void putBytes(std::string& out, uint32_t field, const std::string& bytes) {
  putKey(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out += bytes;
}

// Field numbers (tensorboard/compat/proto/{event,summary,tensor,tensor_shape,types}.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8, kValueMetadata = 9;
constexpr uint32_t kMetadataPluginData = 1, kPluginDataPluginName = 1;
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr int64_t kDtString = 7;  // types.proto: DT_STRING

// Event{wall_time, step, summary: Summary{value: [value]}}, `value` a serialized Summary.Value.
std::string summaryEvent(double wall_time, int64_t step, const std::string& value) {
  std::string summary;
  putBytes(summary, kSummaryValue, value);
  std::string event;
  putDouble(event, kEventWallTime, wall_time);
  putInt64(event, kEventStep, step);
  putBytes(event, kEventSummary, summary);
  return event;
}

[[noreturn]] void failCreatingFolder(const std::string& dir, const std::string& prefix, int err) {
  AIACC_THROW(IoError, "cannot create TensorBoard folder '", dir, "': '", prefix, "': ", std::strerror(err));
}

// mkdir -p: each prefix in turn; EEXIST is fine as long as the whole ends as a directory.
void createFolders(const std::string& dir) {
  for (size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
    const std::string prefix = dir.substr(0, at);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) failCreatingFolder(dir, prefix, errno);
    if (at == std::string::npos) break;
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) failCreatingFolder(dir, dir, errno);
  if (!S_ISDIR(st.st_mode)) failCreatingFolder(dir, dir, ENOTDIR);
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

double TensorBoardWriter::now() {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch());
  return static_cast<double>(us.count()) / 1e6;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, double start_wall_time) {
  createFolders(dir);
  const std::string base = strCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", "events.out.tfevents.",
                                  static_cast<int64_t>(start_wall_time), ".", hostName(), ".", ::getpid(), ".aiacc");
  // A new file, never another writer's: O_EXCL, and the next suffix when the name is taken (two
  // writers of one process in the same second).
  int fd = -1;
  for (int n = 1; fd < 0; ++n) {
    path_ = n == 1 ? base : strCat(base, n);
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || n == 1000)) {
      AIACC_THROW(IoError, "cannot create TensorBoard file '", path_, "': ", std::strerror(errno));
    }
  }
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    AIACC_THROW(IoError, "cannot create TensorBoard file '", path_, "': ", std::strerror(err));
  }
  std::string event;
  putDouble(event, kEventWallTime, start_wall_time);
  putBytes(event, kEventFileVersion, "brain.Event:2");
  try {
    writeRecord(event);
    flush();
  } catch (...) {  // no destructor runs for a constructor that throws
    std::fclose(file_);
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ == nullptr) return;
  if (!error_.empty()) {  // already thrown to the caller
    std::fclose(file_);
    return;
  }
  try {
    close();
  } catch (const std::exception& e) {
    LOG(ERROR) << e.what();
  }
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::string v;
  putBytes(v, kValueTag, tag);
  putFloat(v, kValueSimpleValue, static_cast<float>(value));
  writeRecord(summaryEvent(wall_time, step, v));
}

void TensorBoardWriter::text(const std::string& tag, const std::string& markdown, int64_t step, double wall_time) {
  // What tf.summary.text writes: a scalar DT_STRING tensor (an empty TensorShapeProto), which the
  // text plugin renders as Markdown (a tensor of rank 1 or 2 would become a table). The plugin
  // data's content, a TextPluginData{version: 0}, serializes to no bytes, and so is left out.
  std::string tensor;
  putInt64(tensor, kTensorDtype, kDtString);
  putBytes(tensor, kTensorShape, "");
  putBytes(tensor, kTensorStringVal, markdown);
  std::string plugin_data;
  putBytes(plugin_data, kPluginDataPluginName, "text");
  std::string metadata;
  putBytes(metadata, kMetadataPluginData, plugin_data);
  std::string v;
  putBytes(v, kValueTag, tag);
  putBytes(v, kValueTensor, tensor);
  putBytes(v, kValueMetadata, metadata);
  writeRecord(summaryEvent(wall_time, step, v));
}

void TensorBoardWriter::writeRecord(const std::string& data) {
  checkUsable();
  std::string header;
  putLittleEndian(header, data.size(), 8);
  putLittleEndian(header, maskedCrc32c(header.data(), 8), 4);
  std::string footer;
  putLittleEndian(footer, maskedCrc32c(data.data(), data.size()), 4);
  errno = 0;
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size() ||
      std::fwrite(data.data(), 1, data.size(), file_) != data.size() ||
      std::fwrite(footer.data(), 1, footer.size(), file_) != footer.size()) {
    fail("write", errno);
  }
}

void TensorBoardWriter::flush() {
  checkUsable();
  errno = 0;
  if (std::fflush(file_) != 0) fail("write", errno);
}

void TensorBoardWriter::close() {
  if (file_ == nullptr) {
    if (!error_.empty()) throw IoError(error_);
    return;
  }
  FILE* f = file_;
  file_ = nullptr;
  if (!error_.empty()) {
    std::fclose(f);
    throw IoError(error_);
  }
  errno = 0;
  const bool flushed = std::fflush(f) == 0;
  const int flush_errno = errno;
  errno = 0;
  const bool closed = std::fclose(f) == 0;
  if (!flushed) fail("write", flush_errno);
  if (!closed) fail("close", errno);
}

void TensorBoardWriter::checkUsable() const {
  if (!error_.empty()) throw IoError(error_);
  if (file_ == nullptr) AIACC_THROW(Error, "TensorBoard file '", path_, "' is already closed");
}

void TensorBoardWriter::fail(const std::string& what, int err) {
  error_ = strCat("cannot ", what, " TensorBoard file '", path_, "': ", std::strerror(err != 0 ? err : EIO));
  throw IoError(error_);
}

}  // namespace aiacc::app
