#include "aiacc/common/checkpoint_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <utility>

#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"

namespace aiacc {
namespace {

constexpr const char* kManifestFormat = "aiacc-checkpoint-manifest";
constexpr int kManifestVersion = 1;
constexpr const char* kLatestName = "latest";
constexpr size_t kMaxSmallFile = 4096;  // a manifest or `latest` larger than this is not one

std::string join(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

// A quote of untrusted file content for a one-line message: printable ASCII, at most 60 characters.
std::string quote(const std::string& s) {
  std::string out = s.substr(0, 60);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return "'" + out + (s.size() > 60 ? "...'" : "'");
}

// The step in a canonical name "step-<digits>.<ext>" (exactly what checkpoint*Name prints).
std::optional<int64_t> stepOfName(const std::string& name, const std::string& ext) {
  const std::string prefix = "step-", suffix = "." + ext;
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  const int64_t step = std::stoll(digits);
  const std::string canonical = ext == "ckpt" ? checkpointPayloadName(step) : checkpointManifestName(step);
  if (name != canonical) return std::nullopt;
  return step;
}

// ---- Reading: whole small files, payloads of an expected size.
struct FileRead {
  int err = 0;  // errno of the failure, 0 on success
  std::string bytes;
};

// Reads the whole of `path`; a file of more than `limit` bytes is read as EFBIG.
FileRead readFile(const std::string& path, size_t limit) {
  FileRead r;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.err = errno;
    return r;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    r.err = errno;
  } else if (static_cast<uint64_t>(st.st_size) > limit) {
    r.err = EFBIG;
  } else {
    r.bytes.resize(static_cast<size_t>(st.st_size));
    size_t off = 0;
    while (off < r.bytes.size()) {
      const ssize_t n = ::read(fd, r.bytes.data() + off, r.bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        r.err = errno;
        break;
      }
      if (n == 0) break;  // shrank while being read
      off += static_cast<size_t>(n);
    }
    r.bytes.resize(off);
  }
  ::close(fd);
  return r;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// ---- The manifest.
struct Manifest {
  int64_t step = 0;
  std::string payload;
  uint64_t size = 0;
  uint32_t crc = 0;
};

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08" PRIx32, v);
  return buf;
}

std::string manifestText(int64_t step, const std::string& bytes) {
  return strCat(kManifestFormat, " ", kManifestVersion, "\nstep ", step, "\npayload ", checkpointPayloadName(step),
                "\nsize ", bytes.size(), "\ncrc32c ", hex8(crc32c(bytes.data(), bytes.size())), "\n");
}

// Decimal or lowercase hexadecimal digits only (no sign, no space), at most max_digits of them.
std::optional<uint64_t> parseUnsigned(const std::string& s, int base, size_t max_digits) {
  if (s.empty() || s.size() > max_digits) return std::nullopt;
  for (char c : s) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || (base == 16 && c >= 'a' && c <= 'f'))) return std::nullopt;
  }
  return std::stoull(s, nullptr, base);
}

struct ParsedManifest {
  std::optional<Manifest> manifest;
  std::string why;  // when there is no manifest
};

ParsedManifest parseManifest(const std::string& text) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) return {std::nullopt, "no newline after its last line (truncated?)"};
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  const auto value = [&](size_t i, const std::string& key) -> std::optional<std::string> {
    if (i >= lines.size() || lines[i].compare(0, key.size() + 1, key + " ") != 0) return std::nullopt;
    return lines[i].substr(key.size() + 1);
  };
  const auto bad = [&](size_t i, const std::string& key) {
    return ParsedManifest{std::nullopt, strCat("line ", i + 1, ": expected '", key, " ...', got ",
                                               i < lines.size() ? quote(lines[i]) : "nothing")};
  };
  const auto version = value(0, kManifestFormat);
  if (!version)
    return {std::nullopt, "not an aiacc checkpoint manifest (first line " + quote(lines.empty() ? "" : lines[0]) + ")"};
  if (*version != std::to_string(kManifestVersion)) {
    return {std::nullopt, strCat("manifest format version ", quote(*version), ", this build reads ", kManifestVersion)};
  }
  Manifest m;
  const auto step = value(1, "step");
  const auto step_n = step ? parseUnsigned(*step, 10, 18) : std::nullopt;
  if (!step_n) return bad(1, "step");
  m.step = static_cast<int64_t>(*step_n);
  const auto payload = value(2, "payload");
  if (!payload) return bad(2, "payload");
  m.payload = *payload;
  const auto size = value(3, "size");
  const auto size_n = size ? parseUnsigned(*size, 10, 19) : std::nullopt;
  if (!size_n) return bad(3, "size");
  m.size = *size_n;
  const auto crc = value(4, "crc32c");
  const auto crc_n = crc && crc->size() == 8 ? parseUnsigned(*crc, 16, 8) : std::nullopt;
  if (!crc_n) return bad(4, "crc32c");
  m.crc = static_cast<uint32_t>(*crc_n);
  if (lines.size() != 5) return {std::nullopt, strCat(lines.size(), " lines, expected 5")};
  return {m, ""};
}

// ---- Checking one checkpoint.
struct Checked {
  std::optional<CheckpointFile> file;
  std::string why;  // when there is no file: one line naming the payload and the reason
};

Checked checkStep(const std::string& dir, int64_t step) {
  const std::string payload_path = join(dir, checkpointPayloadName(step));
  const std::string manifest_name = checkpointManifestName(step);
  const auto reject = [&](const std::string& why) { return Checked{std::nullopt, payload_path + ": " + why}; };
  const FileRead mr = readFile(join(dir, manifest_name), kMaxSmallFile);
  if (mr.err == ENOENT) return reject("manifest " + manifest_name + " does not exist");
  if (mr.err == EFBIG)
    return reject("manifest " + manifest_name + ": larger than " + std::to_string(kMaxSmallFile) + " bytes");
  if (mr.err) return reject("manifest " + manifest_name + ": cannot read: " + std::strerror(mr.err));
  const ParsedManifest parsed = parseManifest(mr.bytes);
  if (!parsed.manifest) return reject("manifest " + manifest_name + ": " + parsed.why);
  const Manifest& m = *parsed.manifest;
  if (m.step != step || m.payload != checkpointPayloadName(step)) {
    return reject(strCat("manifest ", manifest_name, " is for step ", m.step, " (", quote(m.payload), ")"));
  }
  const FileRead pr = readFile(payload_path, m.size);
  if (pr.err == ENOENT) return reject(strCat("does not exist (its manifest says ", m.size, " bytes)"));
  if (pr.err == EFBIG) return reject(strCat("longer than the ", m.size, " bytes its manifest says"));
  if (pr.err) return reject(strCat("cannot read: ", std::strerror(pr.err)));
  if (pr.bytes.size() != m.size) return reject(strCat("truncated: ", pr.bytes.size(), " of ", m.size, " bytes"));
  const uint32_t crc = crc32c(pr.bytes.data(), pr.bytes.size());
  if (crc != m.crc) return reject(strCat("checksum mismatch: crc32c ", hex8(crc), ", manifest says ", hex8(m.crc)));
  return Checked{CheckpointFile{payload_path, step, std::move(pr.bytes)}, ""};
}

// ---- Listing.
struct Listing {
  std::vector<int64_t> steps;       // with a payload or a manifest, newest first, each once
  std::vector<std::string> others;  // every other name (temporary files among them)
};

// Throws IoError when `dir` cannot be listed; ENOENT is returned as nothing.
std::optional<Listing> listDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return std::nullopt;
    AIACC_THROW(IoError, "cannot list checkpoint directory '", dir, "': ", std::strerror(errno));
  }
  Listing l;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (auto s = stepOfName(name, "ckpt")) {
      l.steps.push_back(*s);
    } else if (auto m = stepOfName(name, "manifest")) {
      l.steps.push_back(*m);
    } else {
      l.others.push_back(name);
    }
  }
  ::closedir(d);
  std::sort(l.steps.rbegin(), l.steps.rend());
  l.steps.erase(std::unique(l.steps.begin(), l.steps.end()), l.steps.end());
  return l;
}

// What `latest` names: the step, or a one-line reason it names nothing usable (empty: no `latest`).
struct Latest {
  std::optional<int64_t> step;
  std::string why;
};

Latest readLatest(const std::string& dir) {
  const std::string path = join(dir, kLatestName);
  const FileRead r = readFile(path, kMaxSmallFile);
  if (r.err == ENOENT) return {};
  if (r.err == EFBIG) return {std::nullopt, path + ": larger than " + std::to_string(kMaxSmallFile) + " bytes"};
  if (r.err) return {std::nullopt, path + ": cannot read: " + std::strerror(r.err)};
  std::string name = r.bytes;
  if (!name.empty() && name.back() == '\n') name.pop_back();
  const auto step = stepOfName(name, "ckpt");
  if (!step) return {std::nullopt, path + ": does not name a checkpoint: " + quote(r.bytes)};
  return {step, ""};
}

// Removes a temporary file of one of our names that a writer left when it was killed, if that
// writer was a process of this host (common/atomic_file.h's isOrphanedTempFile).
void removeIfDeadWritersTemp(const std::string& dir, const std::string& name) {
  const size_t at = name.find(".tmp.");
  if (at == std::string::npos) return;
  const std::string base = name.substr(0, at);
  if (base != kLatestName && !stepOfName(base, "ckpt") && !stepOfName(base, "manifest")) return;
  if (isOrphanedTempFile(name)) ::unlink(join(dir, name).c_str());
}

}  // namespace

const char* phaseName(CheckpointPhase phase) {
  switch (phase) {
    case CheckpointPhase::kBeforePayload: return "before-payload";
    case CheckpointPhase::kMidPayload: return "mid-payload";
    case CheckpointPhase::kBeforeManifest: return "before-manifest";
    case CheckpointPhase::kBeforeLatest: return "before-latest";
    case CheckpointPhase::kBeforeRetention: return "before-retention";
    case CheckpointPhase::kWriterIdle: return "writer-idle";
  }
  return "unknown";
}

std::string checkpointPayloadName(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "step-%012" PRId64 ".ckpt", step);
  return buf;
}

bool pointLatestAt(const std::string& dir, int64_t step) {
  const std::optional<int64_t> now = readLatest(dir).step;
  if ((now && *now >= step) || !exists(join(dir, checkpointPayloadName(step))) ||
      !exists(join(dir, checkpointManifestName(step))))
    return false;
  writeFileAtomic(join(dir, kLatestName), checkpointPayloadName(step) + "\n");
  return true;
}

std::vector<int64_t> checkpointSteps(const std::string& dir) {
  std::optional<Listing> listing = listDir(dir);
  return listing ? std::move(listing->steps) : std::vector<int64_t>{};
}

std::string checkpointManifestName(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "step-%012" PRId64 ".manifest", step);
  return buf;
}

// ---- CheckpointDir

CheckpointDir::CheckpointDir(std::string dir, CheckpointDirOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  AIACC_CHECK_INPUT(options_.keep >= 1, "checkpoints to keep must be at least 1, got ", options_.keep);
  AIACC_CHECK_INPUT(!dir_.empty(), "checkpoint directory: empty path");
  // mkdir -p: each prefix in turn; EEXIST is fine as long as the whole ends as a directory.
  for (size_t at = dir_.find('/', 1);; at = dir_.find('/', at + 1)) {
    const std::string prefix = dir_.substr(0, at);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      AIACC_THROW(IoError, "cannot create checkpoint directory '", dir_, "': '", prefix, "': ", std::strerror(errno));
    }
    if (at == std::string::npos) break;
  }
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    AIACC_THROW(IoError, "checkpoint directory '", dir_, "' is not a directory");
  }
}

void CheckpointDir::hook(CheckpointPhase phase, int64_t step) const {
  if (options_.fault_hook) options_.fault_hook(phase, step);
}

void CheckpointDir::write(int64_t step, const std::string& bytes) {
  AIACC_CHECK_INPUT(step >= 0, "checkpoint step must be >= 0, got ", step);
  // A step written before: its files are not ours to remove on failure (a failure after the
  // payload's rename leaves it invalid, and retention removes it in time).
  const bool existed = exists(join(dir_, checkpointPayloadName(step))) ||
                       exists(join(dir_, checkpointManifestName(step)));
  try {
    writeFiles(step, bytes);
  } catch (const std::exception& e) {
    if (!existed) removeStepUnlessLatest(step);
    AIACC_THROW(IoError, "checkpoint step ", step, " not saved in '", dir_, "': ", firstLine(e.what()));
  } catch (...) {
    if (!existed) removeStepUnlessLatest(step);
    AIACC_THROW(IoError, "checkpoint step ", step, " not saved in '", dir_, "': unknown exception");
  }
  try {
    hook(CheckpointPhase::kBeforeRetention, step);
    retain(step);
  } catch (const std::exception& e) {
    AIACC_THROW(CheckpointRetentionError, "checkpoint step ", step,
                " saved, but old checkpoints not removed: ", firstLine(e.what()));
  }
}

void CheckpointDir::writeFiles(int64_t step, const std::string& bytes) {
  const std::string payload = join(dir_, checkpointPayloadName(step));
  hook(CheckpointPhase::kBeforePayload, step);
  // The payload by hand, in two halves, so that a test's hook can stop a writer between them.
  writeFileAtomicByPath(payload, [&](const std::string& tmp) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) AIACC_THROW(IoError, "cannot create temporary file '", tmp, "': ", std::strerror(errno));
    struct Closer {  // on a throw
      int fd;
      ~Closer() {
        if (fd >= 0) ::close(fd);
      }
    } closer{fd};
    const auto writeRange = [&](size_t begin, size_t end) {
      while (begin < end) {
        const ssize_t n = ::write(fd, bytes.data() + begin, end - begin);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) AIACC_THROW(IoError, "cannot write temporary file '", tmp, "': ", std::strerror(errno));
        begin += static_cast<size_t>(n);
      }
    };
    writeRange(0, bytes.size() / 2);
    hook(CheckpointPhase::kMidPayload, step);
    writeRange(bytes.size() / 2, bytes.size());
    closer.fd = -1;
    if (::close(fd) != 0) AIACC_THROW(IoError, "cannot write temporary file '", tmp, "': ", std::strerror(errno));
  });
  hook(CheckpointPhase::kBeforeManifest, step);
  writeFileAtomic(join(dir_, checkpointManifestName(step)), manifestText(step, bytes));
  hook(CheckpointPhase::kBeforeLatest, step);
  writeFileAtomic(join(dir_, kLatestName), checkpointPayloadName(step) + "\n");
}

void CheckpointDir::removeStepUnlessLatest(int64_t step) {
  if (readLatest(dir_).step == step) return;  // renamed into place: the directory fsync failed
  ::unlink(join(dir_, checkpointManifestName(step)).c_str());
  ::unlink(join(dir_, checkpointPayloadName(step)).c_str());
}

void CheckpointDir::retain(int64_t newest_step) {
  const std::optional<Listing> listing = listDir(dir_);
  if (!listing) AIACC_THROW(IoError, "checkpoint directory '", dir_, "' has disappeared");
  std::string failed;
  int kept = 0;
  for (const int64_t step : listing->steps) {  // newest first
    // A later step is not this writer's past: an earlier run's, or another writer's newer state
    // (an elastic survivor one step behind rank 0). Counted, K of them left this run only the
    // checkpoint it had just written.
    if (step > newest_step) continue;
    if (step == newest_step || kept < options_.keep) {
      ++kept;
      continue;
    }
    // The manifest first: a payload without one is plainly incomplete to a reader.
    for (const std::string& name : {checkpointManifestName(step), checkpointPayloadName(step)}) {
      const std::string path = join(dir_, name);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT && failed.empty()) {
        failed = strCat("cannot delete '", path, "': ", std::strerror(errno));
      }
    }
  }
  for (const std::string& name : listing->others) removeIfDeadWritersTemp(dir_, name);
  if (!failed.empty()) AIACC_THROW(IoError, failed);
}

// ---- findNewestValid

std::optional<CheckpointFile> findNewestValid(const std::string& dir,
                                              const std::function<void(const std::string& line)>& report,
                                              const std::function<std::string(const CheckpointFile& file)>& accept) {
  const auto say = [&](const std::string& line) {
    if (report) report(line);
  };
  // Whether a whole checkpoint is taken (else the reason is said).
  const auto taken = [&](Checked& c) {
    if (!c.file) {
      say(c.why);
      return false;
    }
    const std::string why = accept ? accept(*c.file) : std::string();
    if (why.empty()) return true;
    say(strCat(c.file->path, ": ", why));
    return false;
  };
  const std::optional<Listing> listing = listDir(dir);
  if (!listing) return std::nullopt;
  const Latest latest = readLatest(dir);
  if (latest.step) {
    if (!exists(join(dir, checkpointPayloadName(*latest.step)))) {
      say(strCat(join(dir, kLatestName), ": names ", checkpointPayloadName(*latest.step), " which does not exist"));
    } else {
      Checked c = checkStep(dir, *latest.step);
      if (taken(c)) return std::move(c.file);
    }
  } else if (!latest.why.empty()) {
    say(latest.why);
  } else if (!listing->steps.empty()) {
    say(strCat(join(dir, kLatestName), ": does not exist; choosing among ", listing->steps.size(),
               " checkpoints by step"));
  }
  // The steps before the one `latest` names first, newest first: a later one is an earlier run's
  // (kept by retention, not this run's to resume) unless a crash came between its manifest and
  // `latest`, which costs a step more only when `latest`'s own checkpoint is damaged as well.
  std::vector<int64_t> order = listing->steps;
  if (latest.step) {
    std::stable_partition(order.begin(), order.end(), [&](int64_t step) { return step < *latest.step; });
  }
  for (const int64_t step : order) {
    if (step == latest.step) continue;
    Checked c = checkStep(dir, step);
    if (taken(c)) return std::move(c.file);
  }
  return std::nullopt;
}

// ---- CheckpointWriter

CheckpointWriter::CheckpointWriter(std::string dir, CheckpointDirOptions options)
    : store_(std::move(dir), options), hook_(std::move(options.fault_hook)), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return state_ == State::kQueued || stopping_; });
    if (state_ != State::kQueued) return;  // stopping, nothing handed over
    Job job = std::move(job_);
    job_ = Job{};
    state_ = State::kWriting;
    lock.unlock();
    std::string error;
    bool saved = false;
    try {
      store_.write(job.step, job.bytes);
    } catch (const CheckpointRetentionError& e) {
      error = firstLine(e.what());
      saved = true;
    } catch (const std::exception& e) {
      error = firstLine(e.what());
    } catch (...) {
      error = strCat("checkpoint step ", job.step, " not saved in '", store_.dir(), "': unknown exception");
    }
    const int64_t step = job.step;
    job = Job{};  // the bytes are freed before the next submit is let in
    lock.lock();
    if (error.empty()) {
      ++written_;
    } else {
      ++failures_;
      if (errors_.size() == kMaxErrors) errors_.erase(errors_.begin());
      errors_.push_back(CheckpointWriteError{step, saved, std::move(error)});
    }
    state_ = State::kIdle;
    cv_.notify_all();
    if (hook_) {
      lock.unlock();
      try {
        hook_(CheckpointPhase::kWriterIdle, step);
      } catch (...) {  // a fault hook's concern ends with the write
      }
      lock.lock();
    }
  }
}

void CheckpointWriter::handOver(std::unique_lock<std::mutex>& lock, int64_t step, std::string bytes) {
  job_ = Job{step, std::move(bytes)};
  state_ = State::kQueued;
  lock.unlock();
  cv_.notify_all();
}

bool CheckpointWriter::trySubmit(int64_t step, std::string&& bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::kIdle) {
    ++refused_;
    return false;
  }
  handOver(lock, step, std::move(bytes));
  return true;
}

void CheckpointWriter::submit(int64_t step, std::string bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return state_ == State::kIdle; });
  handOver(lock, step, std::move(bytes));
}

void CheckpointWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return state_ == State::kIdle; });
}

bool CheckpointWriter::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kIdle;
}

int64_t CheckpointWriter::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

int64_t CheckpointWriter::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

int64_t CheckpointWriter::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

std::vector<CheckpointWriteError> CheckpointWriter::takeErrors() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(errors_, {});
}

}  // namespace aiacc
