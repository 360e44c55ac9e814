// common/checkpoint_dir.h: the newest valid checkpoint survives truncation, bit flips, a bad
// `latest`, a writer killed mid-write and a full disk; retention keeps the newest K; the background
// writer never blocks or throws into the submitting thread.
#include "aiacc/common/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "tests/test_util.h"

namespace aiacc {
namespace {

namespace fs = std::filesystem;

using test::namesIn;

using test::contains;

// n deterministic bytes, every value 0..255 among them.
std::string bytesOf(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : out) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return out;
}

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", static_cast<unsigned>(v));
  return buf;
}

struct Found {
  std::optional<CheckpointFile> file;
  std::vector<std::string> lines;
};

Found find(const std::string& dir) {
  Found f;
  f.file = findNewestValid(dir, [&](const std::string& line) { f.lines.push_back(line); });
  for (const std::string& line : f.lines) EXPECT_FALSE(contains(line, "\n")) << "one line: " << line;
  return f;
}

// The names of step s's files, and `latest`: what a directory is expected to hold.
std::vector<std::string> filesOf(std::vector<int64_t> steps) {
  std::vector<std::string> out{"latest"};
  for (int64_t s : steps) {
    out.push_back(checkpointPayloadName(s));
    out.push_back(checkpointManifestName(s));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A door a fault hook waits at (a slow disk) until the test opens it; a hook that waits 30 s
// gives up, and timedOut() says so (a test that deadlocked fails instead of hanging).
class Gate {
 public:
  void arriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    reached_ = true;
    cv_.notify_all();
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return open_; })) timed_out_ = true;
  }
  void waitReached() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool timedOut() {
    std::lock_guard<std::mutex> lock(mu_);
    return timed_out_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, open_ = false, timed_out_ = false;
};

// pointLatestAt: a writer whose older step moved `latest` after another writer's newer one (two
// CheckpointDirs on one folder, as two survivors) points it at the newer again; not at a step
// whose files are missing, not twice, and never back.
TEST(CheckpointDir, PointLatestAtTheNewerStepAnotherWriterSaved) {
  test::TempDir d;
  CheckpointDir(d.path()).write(5, bytesOf(100, 5));
  CheckpointDir(d.path()).write(3, bytesOf(100, 3));  // `latest`: step 3
  EXPECT_EQ(find(d.path()).file->step, 3);
  EXPECT_TRUE(pointLatestAt(d.path(), 5));
  EXPECT_EQ(find(d.path()).file->step, 5);
  EXPECT_FALSE(pointLatestAt(d.path(), 5));  // names it already
  EXPECT_FALSE(pointLatestAt(d.path(), 7));  // no such checkpoint
  EXPECT_EQ(find(d.path()).file->step, 5);
  EXPECT_FALSE(pointLatestAt(d.path(), 3));  // never back
  EXPECT_EQ(find(d.path()).file->step, 5);
}

// The crc32 instruction's path (where the CPU has SSE4.2) and the tables' agree on every length
// and alignment, whole or continued.
TEST(CheckpointDir, Crc32cInstructionAndTablesAgree) {
  EXPECT_EQ(crc32cPortable("123456789", 9), 0xe3069283u);
  if (!crc32cHasInstruction()) GTEST_SKIP() << "this CPU has no crc32 instruction: both are the tables";
  std::vector<unsigned char> b(4096 + 16);
  uint32_t x = 12345;
  for (auto& c : b) c = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t off = 0; off < 9; ++off) {
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{64}, size_t{1000}, size_t{4096}}) {
      EXPECT_EQ(crc32c(b.data() + off, n), crc32cPortable(b.data() + off, n)) << off << " " << n;
      EXPECT_EQ(crc32c(b.data() + off, n, 0xdeadbeefu), crc32cPortable(b.data() + off, n, 0xdeadbeefu))
          << off << " " << n;
    }
  }
}

TEST(CheckpointDir, Crc32cKnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');  // RFC 3720 B.4
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  const std::string b = bytesOf(1000, 1);
  for (size_t k : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    EXPECT_EQ(crc32c(b.data() + k, b.size() - k, crc32c(b.data(), k)), crc32c(b.data(), b.size())) << k;
  }
}

TEST(CheckpointDir, WriteAndReadBack) {
  test::TempDir d;
  const std::string dir = d / "a/b/ckpts";  // created with its parents
  CheckpointDir store(dir);
  const std::string bytes = bytesOf(10000, 2);
  store.write(1234, bytes);
  EXPECT_EQ(namesIn(dir), filesOf({1234}));
  EXPECT_EQ(test::readText(dir + "/latest"), "step-000000001234.ckpt\n");
  EXPECT_EQ(test::readText(dir + "/step-000000001234.ckpt"), bytes);
  EXPECT_EQ(test::readText(dir + "/step-000000001234.manifest"),
            "aiacc-checkpoint-manifest 1\nstep 1234\npayload step-000000001234.ckpt\nsize 10000\ncrc32c " +
                hex8(crc32c(bytes.data(), bytes.size())) + "\n");
  Found f = find(dir);
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->path, dir + "/step-000000001234.ckpt");
  EXPECT_EQ(f.file->step, 1234);
  EXPECT_EQ(f.file->bytes, bytes);
  EXPECT_EQ(f.lines, std::vector<std::string>{});
  // An empty payload is a checkpoint too; a later step replaces `latest`.
  store.write(1235, "");
  f = find(dir);
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 1235);
  EXPECT_EQ(f.file->bytes, "");
  // No directory, or one without checkpoints: a fresh start, nothing to report.
  EXPECT_FALSE(find(d / "missing").file);
  fs::create_directories(d / "empty");
  f = find(d / "empty");
  EXPECT_FALSE(f.file);
  EXPECT_EQ(f.lines, std::vector<std::string>{});
}

TEST(CheckpointDir, BadArgumentsAreInputErrors) {
  test::TempDir d;
  EXPECT_THROW(CheckpointDir(d.path(), CheckpointDirOptions{0, {}}), InputError);
  CheckpointDir store(d.path());
  EXPECT_THROW(store.write(-1, "x"), InputError);
  test::writeText(d / "file", "x");
  try {
    CheckpointDir bad(d / "file");
    ADD_FAILURE() << "a file is not a checkpoint directory";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), d / "file")) << e.what();
  }
}

TEST(CheckpointDir, RetentionKeepsTheNewestK) {
  test::TempDir d;
  CheckpointDir store(d.path(), CheckpointDirOptions{2, {}});
  for (int64_t step = 1; step <= 5; ++step) store.write(step * 100, bytesOf(100, step));
  EXPECT_EQ(namesIn(d.path()), filesOf({400, 500}));
  const Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 500);
}

// Checkpoints of later steps than the one written (an earlier run's, in the folder a new run
// starts in) are neither deleted nor counted: the new run keeps its newest K (by step, it kept
// only the one it had just written, and deleted it at its next write).
TEST(CheckpointDir, RetentionLeavesLaterStepsAloneAndKeepsTheNewestKBeforeThem) {
  test::TempDir d;
  CheckpointDir(d.path()).write(999, bytesOf(10, 999));
  CheckpointDir store(d.path(), CheckpointDirOptions{2, {}});
  for (int64_t step = 1; step <= 5; ++step) store.write(step, bytesOf(100, step));
  EXPECT_EQ(namesIn(d.path()), filesOf({4, 5, 999}));
  EXPECT_EQ(checkpointSteps(d.path()), (std::vector<int64_t>{999, 5, 4}));
  EXPECT_EQ(find(d.path()).file->step, 5);  // what `latest` names
  store.write(1000, bytesOf(100, 1000));    // past it: 999 is this writer's past now
  EXPECT_EQ(namesIn(d.path()), filesOf({999, 1000}));
  EXPECT_EQ(checkpointSteps(d / "missing"), std::vector<int64_t>{});
}

// A writer killed mid-write leaves its temporary file; the next write removes it when that writer
// was a process of this pid namespace and is gone, and never another host's or container's (a
// folder they share: that pid means nothing here) nor a living writer's.
TEST(CheckpointDir, AWriteRemovesOnlyThisNamespacesDeadWritersTemporaryFiles) {
  test::TempDir d;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string& tag = tempFileTag();
  ASSERT_FALSE(tag.empty());
  EXPECT_EQ(tag.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"),
            std::string::npos)
      << tag;
  const std::string payload = checkpointPayloadName(8);
  const std::string ours = strCat(payload, ".tmp.", tag, ".", dead, ".", dead);
  const std::string older_build = strCat(checkpointManifestName(8), ".tmp.", dead, ".", dead);
  const std::string elsewhere = strCat(payload, ".tmp.", tag, "x.", dead, ".", dead);
  const std::string living = strCat(payload, ".tmp.", tag, ".", ::getppid(), ".1");
  const std::string not_ours = strCat("notes.txt.tmp.", tag, ".", dead, ".", dead);
  for (const std::string& name : {ours, older_build, elsewhere, living, not_ours}) test::writeText(d / name, "partial");
  EXPECT_TRUE(isOrphanedTempFile(ours));
  EXPECT_TRUE(isOrphanedTempFile(older_build));
  EXPECT_FALSE(isOrphanedTempFile(elsewhere));
  EXPECT_FALSE(isOrphanedTempFile(living));
  EXPECT_FALSE(isOrphanedTempFile(strCat(payload, ".tmp.", tag, ".x.1")));
  EXPECT_FALSE(isOrphanedTempFile(strCat(payload, ".tmp.", tag, ".4294967297.1")));  // past pid_t: not a pid
  EXPECT_FALSE(isOrphanedTempFile(strCat(payload, ".tmp.a.b.", dead, ".1")));
  CheckpointDir(d.path()).write(1, bytesOf(100, 1));
  std::vector<std::string> expected = filesOf({1});
  for (const std::string& name : {elsewhere, living, not_ours}) expected.push_back(name);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(namesIn(d.path()), expected);
}

TEST(CheckpointDir, TruncatedNewestFallsBackToThePrevious) {
  test::TempDir d;
  CheckpointDir store(d.path());
  store.write(1, bytesOf(4096, 1));
  store.write(2, bytesOf(4096, 2));
  fs::resize_file(d / "step-000000000002.ckpt", 1000);
  const Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 1);
  EXPECT_EQ(f.file->bytes, bytesOf(4096, 1));
  EXPECT_EQ(f.lines, std::vector<std::string>{d / "step-000000000002.ckpt: truncated: 1000 of 4096 bytes"});
}

TEST(CheckpointDir, FlippedByteFallsBackToThePrevious) {
  test::TempDir d;
  CheckpointDir store(d.path());
  store.write(1, bytesOf(4096, 1));
  std::string bytes = bytesOf(4096, 2);
  store.write(2, bytes);
  bytes[2000] ^= 0x10;
  test::writeText(d / "step-000000000002.ckpt", bytes);
  const Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 1);
  ASSERT_EQ(f.lines.size(), 1u);
  EXPECT_TRUE(contains(f.lines[0], d / "step-000000000002.ckpt: checksum mismatch: crc32c ")) << f.lines[0];
}

TEST(CheckpointDir, BadLatestFallsBackToTheNewestByStep) {
  test::TempDir d;
  CheckpointDir store(d.path());
  for (int64_t step : {1, 2, 3}) store.write(step, bytesOf(100, step));
  test::writeText(d / "latest", "step-000000000009.ckpt\n");
  Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 3);
  EXPECT_EQ(f.lines, std::vector<std::string>{d / "latest: names step-000000000009.ckpt which does not exist"});
  test::writeText(d / "latest", "../../etc/passwd\n");
  f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 3);
  EXPECT_EQ(f.lines, std::vector<std::string>{d / "latest: does not name a checkpoint: '../../etc/passwd?'"});
  fs::remove(d / "latest");
  f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 3);
  EXPECT_EQ(f.lines, std::vector<std::string>{d / "latest: does not exist; choosing among 3 checkpoints by step"});
}

// `latest`'s checkpoint damaged in a folder that also holds an earlier run's later step (kept by
// retention): the fallback is this run's step before it, not the other run's by step.
TEST(CheckpointDir, ADamagedLatestFallsBackToTheStepBeforeItBeforeAnyLaterOne) {
  test::TempDir d;
  CheckpointDir(d.path()).write(999, bytesOf(100, 999));
  CheckpointDir store(d.path());
  for (int64_t step : {4, 5}) store.write(step, bytesOf(100, step));
  test::writeText(d / checkpointPayloadName(5), "torn");
  Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 4);
  ASSERT_EQ(f.lines.size(), 1u);
  EXPECT_EQ(f.lines[0], d / "step-000000000005.ckpt: truncated: 4 of 100 bytes");
  fs::remove(d / checkpointPayloadName(4));  // nothing before it: the later one, said on the way
  f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 999);
  EXPECT_EQ(f.lines.size(), 2u);
}

// Every way a manifest can be wrong is one line naming the checkpoint; temporary files are ignored.
TEST(CheckpointDir, BadManifestsAreReportedOneLineEach) {
  test::TempDir d;
  CheckpointDir store(d.path(), CheckpointDirOptions{10, {}});
  for (int64_t step = 1; step <= 7; ++step) store.write(step, bytesOf(100, step));
  const auto manifest = [&](int64_t step) { return d / checkpointManifestName(step); };
  const std::string seven = test::readText(manifest(7));
  test::writeText(manifest(7), seven.substr(0, seven.find("size ")) + "size 1x\ncrc32c 00000000\n");
  fs::remove(manifest(6));
  test::writeText(manifest(5), "garbage\n");
  test::writeText(manifest(4), "aiacc-checkpoint-manifest 2\nstep 4\n");
  test::writeText(manifest(3), test::readText(manifest(2)));  // another step's
  fs::remove(d / checkpointPayloadName(2));
  test::writeText(d / "step-000000000008.ckpt.tmp.1.1", "partial");
  test::writeText(d / "step-8.ckpt", "not a canonical name");
  const Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 1);
  const std::string p = d.path() + "/step-00000000000";
  EXPECT_EQ(f.lines, (std::vector<std::string>{
                         p + "7.ckpt: manifest step-000000000007.manifest: line 4: expected 'size ...', got 'size 1x'",
                         p + "6.ckpt: manifest step-000000000006.manifest does not exist",
                         p + "5.ckpt: manifest step-000000000005.manifest: not an aiacc checkpoint manifest "
                             "(first line 'garbage')",
                         p + "4.ckpt: manifest step-000000000004.manifest: manifest format version '2', this "
                             "build reads 1",
                         p + "3.ckpt: manifest step-000000000003.manifest is for step 2 ('step-000000000002.ckpt')",
                         p + "2.ckpt: does not exist (its manifest says 100 bytes)",
                     }));
}

// A real process killed (SIGKILL) at each phase of a write: the previous checkpoint stays what
// `latest` names and is valid; without `latest`, no partial checkpoint is chosen; the dead
// writer's temporary file is ignored, then removed by the next write.
TEST(CheckpointDir, WriterKilledMidWriteLeavesThePrevious) {
  for (CheckpointPhase phase :
       {CheckpointPhase::kMidPayload, CheckpointPhase::kBeforeManifest, CheckpointPhase::kBeforeLatest}) {
    SCOPED_TRACE(phaseName(phase));
    test::TempDir d;
    CheckpointDir(d.path()).write(1, bytesOf(8192, 1));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the child: only _exit from here, never back into GoogleTest
      ::close(fds[0]);
      try {
        CheckpointDirOptions options;
        options.fault_hook = [&](CheckpointPhase at, int64_t) {
          if (at != phase) return;
          const char c = 'k';
          if (::write(fds[1], &c, 1) != 1) ::_exit(5);
          for (;;) ::pause();
        };
        CheckpointDir(d.path(), options).write(2, bytesOf(8192, 2));
      } catch (...) {
        ::_exit(4);
      }
      ::_exit(3);
    }
    ::close(fds[1]);
    pollfd p{fds[0], POLLIN, 0};
    const bool reached = ::poll(&p, 1, 30000) == 1;
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fds[0]);
    ASSERT_TRUE(reached) << "the child did not reach the phase (exit status " << status << ")";
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

    Found f = find(d.path());
    ASSERT_TRUE(f.file);
    EXPECT_EQ(f.file->step, 1);
    EXPECT_EQ(f.file->bytes, bytesOf(8192, 1));
    EXPECT_EQ(f.lines, std::vector<std::string>{});
    const std::vector<std::string> names = namesIn(d.path());
    const bool temp_left = std::any_of(names.begin(), names.end(),
                                       [](const std::string& n) { return contains(n, "step-000000000002.ckpt.tmp."); });
    EXPECT_EQ(temp_left, phase == CheckpointPhase::kMidPayload);

    // Without `latest`: step 2 is chosen only if it is complete.
    fs::remove(d / "latest");
    f = find(d.path());
    ASSERT_TRUE(f.file);
    EXPECT_EQ(f.file->step, phase == CheckpointPhase::kBeforeLatest ? 2 : 1);
    if (phase == CheckpointPhase::kBeforeManifest) {
      ASSERT_EQ(f.lines.size(), 2u);
      EXPECT_EQ(f.lines[1], d / "step-000000000002.ckpt: manifest step-000000000002.manifest does not exist");
    }

    CheckpointDir(d.path()).write(3, bytesOf(100, 3));
    for (const std::string& n : namesIn(d.path())) EXPECT_FALSE(contains(n, ".tmp.")) << n;
    f = find(d.path());
    ASSERT_TRUE(f.file);
    EXPECT_EQ(f.file->step, 3);
  }
}

// A real full disk (a 256 KiB tmpfs, root only): the write that does not fit fails as one counted
// line, leaves nothing of itself, and the checkpoint before it stays the newest valid one.
TEST(CheckpointDir, FullDiskFailsTheWriteAndKeepsThePrevious) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  test::TempDir d;
  const std::string mnt = d / "small";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs on " << mnt << ": " << std::strerror(errno);
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  CheckpointWriter writer(mnt, CheckpointDirOptions{1000, {}});
  int64_t step = 1;
  for (; step <= 40; ++step) {
    writer.submit(step, bytesOf(40000, step));
    writer.flush();
    if (writer.failures() > 0) break;
  }
  ASSERT_EQ(writer.failures(), 1) << "256 KiB holds fewer than 40 checkpoints of 40 kB";
  EXPECT_GT(step, 1);
  EXPECT_EQ(writer.written(), step - 1);
  const std::vector<CheckpointWriteError> errors = writer.takeErrors();
  ASSERT_EQ(errors.size(), 1u);
  const std::string& e = errors[0].message;
  EXPECT_EQ(errors[0].step, step);
  EXPECT_FALSE(errors[0].saved);
  EXPECT_TRUE(contains(e, strCat("checkpoint step ", step, " not saved in '", mnt, "'"))) << e;
  EXPECT_TRUE(contains(e, "No space left on device")) << e;
  EXPECT_FALSE(contains(e, "\n")) << e;
  const Found f = find(mnt);
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, step - 1);
  EXPECT_EQ(f.lines, std::vector<std::string>{});
  for (const std::string& n : namesIn(mnt)) {
    EXPECT_FALSE(contains(n, ".tmp.")) << n;
    EXPECT_FALSE(contains(n, checkpointPayloadName(step).substr(0, 17))) << n;
  }
}

// A slow disk: the training thread's trySubmit returns false at once while a write is in flight,
// submit waits for it; an injected failure is counted and reported, never thrown; destruction
// waits for the write in flight.
TEST(CheckpointDir, BackgroundWriterNeverBlocksOrThrowsIntoTheCaller) {
  test::TempDir d;
  Gate slow, at_exit;
  CheckpointDirOptions options;
  options.fault_hook = [&](CheckpointPhase phase, int64_t step) {
    if (step == 2 && phase == CheckpointPhase::kBeforePayload) slow.arriveAndWait();
    if (step == 4 && phase == CheckpointPhase::kBeforeLatest) AIACC_THROW(IoError, "injected: No space left on device");
    if (step == 5 && phase == CheckpointPhase::kBeforeManifest) at_exit.arriveAndWait();
  };
  auto writer = std::make_unique<CheckpointWriter>(d.path(), options);
  EXPECT_TRUE(writer->trySubmit(1, bytesOf(1000, 1)));
  writer->flush();
  EXPECT_EQ(writer->written(), 1);

  EXPECT_TRUE(writer->trySubmit(2, bytesOf(1000, 2)));
  slow.waitReached();
  EXPECT_FALSE(writer->idle());
  std::string refused = bytesOf(1000, 3);
  EXPECT_FALSE(writer->trySubmit(3, std::move(refused)));
  EXPECT_EQ(refused, bytesOf(1000, 3)) << "refused bytes are left to the caller";
  EXPECT_EQ(writer->refused(), 1);
  std::atomic<bool> submitted{false};
  std::thread waiting([&] {
    writer->submit(3, bytesOf(1000, 3));
    submitted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(submitted) << "submit returned while step 2 was still being written";
  slow.open();
  waiting.join();
  writer->flush();
  EXPECT_FALSE(slow.timedOut());
  EXPECT_EQ(writer->written(), 3);
  EXPECT_EQ(writer->failures(), 0);
  EXPECT_EQ(find(d.path()).file.value().step, 3);

  writer->submit(4, bytesOf(1000, 4));
  writer->flush();
  EXPECT_EQ(writer->failures(), 1);
  EXPECT_EQ(writer->written(), 3);
  const std::vector<CheckpointWriteError> errors = writer->takeErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].step, 4);
  EXPECT_FALSE(errors[0].saved);
  EXPECT_EQ(errors[0].message,
            strCat("checkpoint step 4 not saved in '", d.path(), "': injected: No space left on device"));
  EXPECT_TRUE(writer->takeErrors().empty());
  const Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 3);
  EXPECT_EQ(f.lines, std::vector<std::string>{});
  EXPECT_EQ(namesIn(d.path()), filesOf({1, 2, 3})) << "the failed step's files are removed";

  EXPECT_TRUE(writer->trySubmit(5, bytesOf(1000, 5)));
  at_exit.waitReached();
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    at_exit.open();
  });
  writer.reset();  // waits for step 5
  opener.join();
  EXPECT_FALSE(at_exit.timedOut());
  EXPECT_EQ(find(d.path()).file.value().step, 5);
  EXPECT_EQ(namesIn(d.path()), filesOf({2, 3, 5}));
}

// Only the deletion of older checkpoints fails: the step is whole, `latest` names it, and the
// writer says so in the failure's `saved` (not in its wording).
TEST(CheckpointDir, RetentionFailureStillSavesTheStep) {
  test::TempDir d;
  CheckpointDirOptions options;
  options.keep = 1;
  options.fault_hook = [](CheckpointPhase phase, int64_t step) {
    if (phase == CheckpointPhase::kBeforeRetention && step == 2)
      throw std::runtime_error("injected: Permission denied");
  };
  CheckpointWriter writer(d.path(), options);
  writer.submit(1, bytesOf(1000, 1));
  writer.submit(2, bytesOf(1000, 2));
  writer.flush();
  EXPECT_EQ(writer.failures(), 1);
  const std::vector<CheckpointWriteError> errors = writer.takeErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].step, 2);
  EXPECT_TRUE(errors[0].saved);
  EXPECT_EQ(errors[0].message, "checkpoint step 2 saved, but old checkpoints not removed: injected: Permission denied");
  const Found f = find(d.path());
  ASSERT_TRUE(f.file);
  EXPECT_EQ(f.file->step, 2);
  EXPECT_EQ(namesIn(d.path()), filesOf({1, 2})) << "step 1 outlives its retention";
}

}  // namespace
}  // namespace aiacc
