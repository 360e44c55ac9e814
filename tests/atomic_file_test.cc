// common/atomic_file.h: content lands whole, the old file stays until the rename, no temporary
// file survives success or failure, and failures are IoErrors naming the path and the reason.
#include "aiacc/common/atomic_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "aiacc/comm/timeline.h"
#include "aiacc/common/error.h"
#include "tests/json_util.h"
#include "tests/test_util.h"

namespace aiacc {
namespace {

// Every name in dir, sorted: what a test expects to be left there.
using test::namesIn;

// Runs fn, which must throw an IoError; returns its message.
template <typename Fn>
std::string ioErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no IoError thrown";
  return "";
}

using test::contains;

TEST(AtomicFile, WritesTextAndBinary) {
  test::TempDir d;
  writeFileAtomic(d / "a.txt", "hello\n");
  EXPECT_EQ(test::readText(d / "a.txt"), "hello\n");
  const std::string binary("\0\1\2\xff", 4);
  writeFileAtomic(d / "b.bin", binary);
  EXPECT_EQ(test::readText(d / "b.bin"), binary);
  writeFileAtomic(d / "empty", "");
  EXPECT_TRUE(std::filesystem::is_regular_file(d / "empty"));
  EXPECT_EQ(std::filesystem::file_size(d / "empty"), 0u);
  EXPECT_EQ(namesIn(d.path()), (std::vector<std::string>{"a.txt", "b.bin", "empty"})) << "no temporary file left";
}

TEST(AtomicFile, ReplacesAndKeepsTheOldContentUntilTheRename) {
  test::TempDir d;
  const std::string path = d / "r.json";
  writeFileAtomic(path, "old");
  writeFileAtomicStream(path, [&](std::ostream& out) {
    out << "new ";
    // Mid-write: the destination still holds the previous file, the new bytes are elsewhere.
    EXPECT_EQ(test::readText(path), "old");
    out << "content";
  });
  EXPECT_EQ(test::readText(path), "new content");
  writeFileAtomicByPath(path, [&](const std::string& tmp) {
    EXPECT_NE(tmp, path);
    EXPECT_EQ(std::filesystem::path(tmp).parent_path(), std::filesystem::path(path).parent_path())
        << "the temporary file is beside the destination (same file system)";
    test::writeText(tmp, "by path");
    EXPECT_EQ(test::readText(path), "new content");
  });
  EXPECT_EQ(test::readText(path), "by path");
  writeFileAtomic(path, "text again");
  EXPECT_EQ(test::readText(path), "text again");
  EXPECT_EQ(namesIn(d.path()), std::vector<std::string>{"r.json"});
}

TEST(AtomicFile, RelativePathInTheCurrentDirectory) {
  test::TempDir d;
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(d.path());
  writeFileAtomic("plain.txt", "here");
  std::filesystem::current_path(cwd);
  EXPECT_EQ(test::readText(d / "plain.txt"), "here");
}

TEST(AtomicFile, MissingDirectoryIsAClearError) {
  test::TempDir d;
  const std::string path = d / "no/such/dir/x.json";
  const std::string by_text = ioErrorOf([&] { writeFileAtomic(path, "x"); });
  const std::string by_stream = ioErrorOf([&] { writeFileAtomicStream(path, [](std::ostream& out) { out << "x"; }); });
  const std::string by_path = ioErrorOf([&] { writeFileAtomicByPath(path, [](const std::string&) {}); });
  for (const std::string& msg : {by_text, by_stream, by_path}) {
    EXPECT_TRUE(contains(msg, "cannot write '" + path + "'")) << msg;
    EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
    EXPECT_FALSE(contains(msg, "\n")) << "one line: " << msg;
  }
  EXPECT_EQ(namesIn(d.path()), std::vector<std::string>{});
}

// A writer that fails (what a full disk looks like to a caller's writer) leaves the previous
// file and no temporary file; the error names the destination and the writer's reason.
TEST(AtomicFile, FailingWriterKeepsThePreviousFile) {
  test::TempDir d;
  const std::string path = d / "last.ckpt";
  writeFileAtomic(path, "previous");
  std::string tmp_seen;
  std::string msg = ioErrorOf([&] {
    writeFileAtomicByPath(path, [&](const std::string& tmp) {
      tmp_seen = tmp;
      test::writeText(tmp, "partial");
      AIACC_THROW(IoError, "cannot write '", tmp, "' (disk full?)");
    });
  });
  EXPECT_TRUE(contains(msg, "cannot write '" + path + "'")) << msg;
  EXPECT_TRUE(contains(msg, "disk full")) << msg;
  EXPECT_FALSE(std::filesystem::exists(tmp_seen)) << tmp_seen;
  msg = ioErrorOf([&] {
    writeFileAtomicStream(path, [](std::ostream& out) {
      out << "partial";
      throw std::runtime_error("No space left on device");
    });
  });
  EXPECT_TRUE(contains(msg, "cannot write '" + path + "': No space left on device")) << msg;
  // A stream that goes bad (as writing to /dev/full does) is a failure too, after the writer returns.
  msg = ioErrorOf([&] {
    writeFileAtomicStream(path, [](std::ostream& out) {
      out << "partial";
      out.setstate(std::ios::badbit);
    });
  });
  EXPECT_TRUE(contains(msg, "cannot write '" + path + "'")) << msg;
  EXPECT_EQ(test::readText(path), "previous");
  EXPECT_EQ(namesIn(d.path()), std::vector<std::string>{"last.ckpt"}) << "temporary files removed";
}

TEST(AtomicFile, WriterInputErrorsPassThroughUnchanged) {
  test::TempDir d;
  const auto bad_input = [](const std::string& tmp) {
    test::writeText(tmp, "x");
    AIACC_THROW(InputError, "unsupported dtype");
  };
  EXPECT_THROW(writeFileAtomicByPath(d / "w", bad_input), InputError);
  EXPECT_EQ(namesIn(d.path()), std::vector<std::string>{});
}

TEST(AtomicFile, WriterThatCreatesNothingIsAnError) {
  test::TempDir d;
  const std::string msg = ioErrorOf([&] { writeFileAtomicByPath(d / "w", [](const std::string&) {}); });
  EXPECT_TRUE(contains(msg, "did not create")) << msg;
  EXPECT_FALSE(std::filesystem::exists(d / "w"));
}

// A destination that cannot be replaced (a folder of that name) fails at the rename.
TEST(AtomicFile, FailedRenameRemovesTheTemporaryFile) {
  test::TempDir d;
  std::filesystem::create_directories(d / "taken/inside");
  const std::string msg = ioErrorOf([&] { writeFileAtomic(d / "taken", "x"); });
  EXPECT_TRUE(contains(msg, "cannot write '" + d / "taken" + "'")) << msg;
  EXPECT_TRUE(contains(msg, "rename")) << msg;
  EXPECT_EQ(namesIn(d.path()), std::vector<std::string>{"taken"});
  EXPECT_TRUE(std::filesystem::is_directory(d / "taken/inside"));
}

// The timeline writes through the helper: a complete JSON array, and an IoError naming the path.
TEST(AtomicFile, TimelineFlushesThroughIt) {
  test::TempDir d;
  {
    comm::Timeline t(d / "trace.json");
    t.nameRow(0, "compute");
    t.flush();
  }
  const Json json = test::readJson(d / "trace.json");
  ASSERT_EQ(json.size(), 1u) << json;
  EXPECT_EQ(json[0].at("name"), "thread_name");
  EXPECT_EQ(json[0].at("args").at("name"), "compute");
  EXPECT_EQ(namesIn(d.path()), std::vector<std::string>{"trace.json"});
  comm::Timeline bad(d / "missing/trace.json");
  const std::string msg = ioErrorOf([&] { bad.flush(); });
  EXPECT_TRUE(contains(msg, "missing/trace.json")) << msg;
}

}  // namespace
}  // namespace aiacc
