// common/crc32c.h against RFC 3720's vectors, and app/tensorboard.h's event files: the TFRecord
// framing read back here (both CRCs of every record; any flipped byte is caught), the Event bytes
// against protobuf's own serialization, TensorBoard's own reader on scalars and text
// (scripts/tensorboard_check.py, with the pinned tensorboard of scripts/tools_venv.sh), and the
// one-line IoErrors of a folder that cannot be made and of a write that fails.
#include "app/tensorboard.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "aiacc/common/crc32c.h"
#include "aiacc/common/error.h"
#include "tests/test_util.h"

namespace aiacc::app {
namespace {

uint32_t crcOf(const std::vector<uint8_t>& b) { return crc32c(b.data(), b.size()); }

// RFC 3720 (iSCSI), appendix B.4, and the customary check value of "123456789".
TEST(Crc32c, Rfc3720KnownAnswers) {
  std::vector<uint8_t> b(32, 0x00);
  EXPECT_EQ(crcOf(b), 0x8A9136AAu);
  b.assign(32, 0xFF);
  EXPECT_EQ(crcOf(b), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crcOf(b), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crcOf(b), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

// Every split point of lengths around the 8-byte stride, at every alignment of the start.
TEST(Crc32c, IncrementalEqualsOneShot) {
  std::vector<uint8_t> b(80);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; start + n <= b.size(); n += 5) {
      const uint8_t* p = b.data() + start;
      const uint32_t whole = crc32c(p, n);
      for (size_t k = 0; k <= n; ++k)
        ASSERT_EQ(crc32c(p + k, n - k, crc32c(p, k)), whole) << start << " " << n << " " << k;
    }
  }
}

// 0xE3069283 rotated right by 15: its low 15 bits 0x1283 go to the top (0x1283 << 17 = 0x25060000),
// the rest move down (0xE3069283 >> 15 = 0x0001C60D): 0x2507C60D; plus 0xA282EAD8 is 0xC78AB0E5,
// as tensorboard's own masked_crc32c(b"123456789") gives.
TEST(Crc32c, MaskedValueByHand) {
  EXPECT_EQ(maskedCrc32c(0xE3069283u), 0xC78AB0E5u);
  EXPECT_EQ(maskedCrc32c("123456789", 9), 0xC78AB0E5u);
  EXPECT_EQ(maskedCrc32c(0u), 0xA282EAD8u);
  EXPECT_EQ(maskedCrc32c(0xFFFFFFFFu), 0xA282EAD7u);  // all ones rotate to all ones; the sum wraps
}

uint64_t littleEndian(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(b[at + i]);
  return v;
}

// TFRecord framing read back: each record's data, or `error` naming the first bad record.
struct Records {
  std::vector<std::string> data;
  std::string error;
};

Records parseRecords(const std::string& b) {
  Records r;
  for (size_t at = 0; at < b.size();) {
    const std::string where = "record " + std::to_string(r.data.size()) + ": ";
    if (b.size() - at < 12) return r.error = where + "truncated header", r;
    if (maskedCrc32c(b.data() + at, 8) != littleEndian(b, at + 8, 4)) return r.error = where + "header crc", r;
    const uint64_t n = littleEndian(b, at, 8);
    if (b.size() - at - 12 < n + 4) return r.error = where + "truncated data", r;
    const std::string data = b.substr(at + 12, n);
    if (maskedCrc32c(data.data(), data.size()) != littleEndian(b, at + 12 + n, 4))
      return r.error = where + "data crc", r;
    r.data.push_back(data);
    at += 12 + n + 4;
  }
  return r;
}

std::string hex(const std::string& b) {
  std::string out;
  char buf[3];
  for (const char c : b) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<uint8_t>(c));
    out += buf;
  }
  return out;
}

using test::contains;

TEST(TensorBoard, RecordsAreFramedWithBothCrcs) {
  test::TempDir d;
  const std::string dir = d / "runs/a/b";  // created, like mkdir -p
  TensorBoardWriter w(dir, 1.5);
  const std::string name = std::filesystem::path(w.path()).filename().string();
  EXPECT_EQ(std::filesystem::path(w.path()).parent_path().string(), dir);
  EXPECT_EQ(name.rfind("events.out.tfevents.1.", 0), 0u) << name;
  EXPECT_TRUE(contains(name, "." + std::to_string(::getpid()) + ".aiacc")) << name;
  // The first record is visible at once: Event{wall_time: 1.5, file_version: "brain.Event:2"}.
  Records r = parseRecords(test::readText(w.path()));
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.data.size(), 1u);
  EXPECT_EQ(hex(r.data[0]), "09000000000000f83f1a0d627261696e2e4576656e743a32");
  for (int i = 0; i < 5; ++i) w.scalar("loss", 1.0 / (i + 1), i * 10, 2.0 + i);
  w.text("notes", "step *ten*", 10, 9.0);
  w.flush();  // now a reader sees all of it, while the writer stays open
  r = parseRecords(test::readText(w.path()));
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.data.size(), 7u);
  w.close();
  w.close();  // idempotent
  EXPECT_EQ(parseRecords(test::readText(w.path())).data.size(), 7u);
  EXPECT_THROW(w.scalar("loss", 0, 60, 8.0), Error);
}

// The Event bytes equal protobuf's serialization of the same messages (tensorboard 2.21.0's
// protos, protobuf 7.36.2: event_pb2.Event(wall_time=1.5, step=-3, summary=...).SerializeToString()
// and text_pb("t", "hi") of tensorboard/plugins/text/summary_v2.py), and the scalar record's
// header and CRCs equal tensorboard's masked_crc32c of them.
TEST(TensorBoard, EncodesEventsAsProtobufDoes) {
  test::TempDir d;
  TensorBoardWriter w(d.path(), 1.5);
  w.scalar("a", 2.0, -3, 1.5);
  w.text("t", "hi", 300, 1.5);
  w.close();
  const std::string bytes = test::readText(w.path());
  const Records r = parseRecords(bytes);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.data.size(), 3u);
  EXPECT_EQ(hex(r.data[1]), "09000000000000f83f10fdffffffffffffffff012a0a0a080a01611500000040");
  EXPECT_EQ(hex(r.data[2]), "09000000000000f83f10ac022a190a170a0174420808071200420268694a080a060a0474657874");
  const size_t second = 12 + r.data[0].size() + 4;
  EXPECT_EQ(hex(bytes.substr(second, 8)), "2000000000000000");    // length 32
  EXPECT_EQ(hex(bytes.substr(second + 8, 4)), "29eda950");        // masked crc 0x50a9ed29
  EXPECT_EQ(hex(bytes.substr(second + 12 + 32, 4)), "d4c7d726");  // masked crc 0x26d7c7d4
}

TEST(TensorBoard, EveryFlippedByteIsDetected) {
  test::TempDir d;
  TensorBoardWriter w(d.path(), 1.5);
  w.scalar("loss", 0.25, 1, 2.0);
  w.text("notes", "*hi*", 1, 2.0);
  w.close();
  const std::string good = test::readText(w.path());
  ASSERT_EQ(parseRecords(good).error, "");
  for (size_t i = 0; i < good.size(); ++i) {
    for (const uint8_t bit : {0x01, 0x80}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ bit);
      EXPECT_NE(parseRecords(bad).error, "") << "byte " << i << " bit " << int{bit};
    }
  }
  EXPECT_EQ(parseRecords(good.substr(0, good.size() - 1)).error, "record 2: truncated data");
}

// A JSON string: quotes, backslashes and control characters escaped; UTF-8 as it is.
std::string json(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<uint8_t>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// TensorBoard's own reader (EventAccumulator, its CRC-checking record reader, the text plugin's
// Markdown renderer) on scalars at non-consecutive steps, a step past 2^32, values that float32
// rounds (0.1), a negative, a tiny (denormal) and a large one, and Markdown text with UTF-8.
TEST(TensorBoard, TensorBoardReadsScalarsAndText) {
  struct Point {
    std::string tag;
    int64_t step;
    double value;
  };
  const std::vector<Point> scalars = {
      {"train/loss", 0, 2.302585092994046}, {"train/loss", 7, -0.5},          {"train/lr", 3, 1e-40},
      {"train/loss", 1000000, 0.1},         {"train/lr", 5000000000, 1.5e30}, {"train/lr", 5000000001, -3.25e-30}};
  const std::string markdown =
      "# Résumé ✓\n\n**bold** and *ünïcödé* 日本語 <script>x</script>\n\n- lr: 0.1\n- batch: 256\n\n"
      "| a | b |\n|---|---|\n| 1 | 2 |\n";
  test::TempDir d;
  const double t0 = 1700000000.25;
  std::string expected_scalars;
  {
    TensorBoardWriter w(d / "run", t0);
    std::string loss, lr;
    for (size_t i = 0; i < scalars.size(); ++i) {
      const Point& p = scalars[i];
      const double t = t0 + 1.125 + 0.5 * static_cast<double>(i);
      w.scalar(p.tag, p.value, p.step, t);
      std::string& list = p.tag == "train/loss" ? loss : lr;
      list += (list.empty() ? "" : ", ") +
              ("[" + std::to_string(p.step) + ", " + number(p.value) + ", " + number(t) + "]");
    }
    w.text("config/flags", markdown, 0, t0 + 10);
    w.text("config/flags", "second", 10, t0 + 11);
    expected_scalars = "{\"train/loss\": [" + loss + "], \"train/lr\": [" + lr + "]}";
  }  // the destructor closes the file
  test::writeText(
      d / "expected.json",
      "{\"records\": 9, \"start_wall_time\": " + number(t0) + ", \"scalars\": " + expected_scalars +
          ", \"texts\": {\"config/flags\": [[0, " + json(markdown) + ", " + number(t0 + 10) +
          ", [\"<h1>Résumé ✓</h1>\", \"<strong>bold</strong>\", \"<em>ünïcödé</em> 日本語\", \"&lt;script&gt;\", " +
          "\"<li>lr: 0.1</li>\", \"<td>2</td>\"]], [10, \"second\", " + number(t0 + 11) + ", [\"<p>second</p>\"]]]}}");
  const std::string python = AIACC_TOOLS_PYTHON;
  ASSERT_TRUE(std::filesystem::exists(python))
      << python << " is missing: run scripts/setup.sh (scripts/tools_venv.sh installs the pinned tensorboard)";
  const auto [rc, out] = test::runShell(python + " " + test::sourceDir() + "/scripts/tensorboard_check.py " +
                                        (d / "run") + " " + (d / "expected.json") + " 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "tensorboard_check: OK")) << out;
}

TEST(TensorBoard, FolderThatCannotBeCreatedIsOneLineError) {
  test::TempDir d;
  test::writeText(d / "file", "x");
  try {
    TensorBoardWriter w(d / "file/runs", 1.5);
    FAIL() << "no error for a folder under a regular file";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what, "cannot create TensorBoard folder '" + (d / "file/runs") + "': '" + (d / "file/runs") +
                        "': Not a directory");
  }
  try {
    TensorBoardWriter w(d / "file", 1.5);
    FAIL() << "no error for a regular file as the folder";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "Not a directory")) << e.what();
  }
}

// Two writers in one process and one second: two files, neither overwritten.
TEST(TensorBoard, TwoWritersGetTwoFiles) {
  test::TempDir d;
  TensorBoardWriter a(d.path(), 7.0);
  TensorBoardWriter b(d.path(), 7.5);
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(b.path(), a.path() + "2");
}

// A write the file system refuses (here the file size limit: EFBIG, as disk full gives ENOSPC)
// is an IoError naming the file and the reason, and every later call throws it again.
TEST(TensorBoard, FailedWriteThrowsAndLaterCallsToo) {
  test::TempDir d;
  TensorBoardWriter w(d.path(), 1.5);
  struct FileSizeLimit {
    rlimit old{};
    void (*old_handler)(int) = nullptr;
    FileSizeLimit() {
      ::getrlimit(RLIMIT_FSIZE, &old);
      old_handler = ::signal(SIGXFSZ, SIG_IGN);  // else the write kills the process
      rlimit lim = old;
      lim.rlim_cur = 1024;
      ::setrlimit(RLIMIT_FSIZE, &lim);
    }
    ~FileSizeLimit() {
      ::setrlimit(RLIMIT_FSIZE, &old);
      ::signal(SIGXFSZ, old_handler);
    }
  };
  std::string what;
  {
    FileSizeLimit limit;
    try {
      w.text("big", std::string(64 * 1024, 'x'), 1, 2.0);
      w.flush();
    } catch (const IoError& e) {
      what = e.what();
    }
  }
  EXPECT_EQ(what, "cannot write TensorBoard file '" + w.path() + "': File too large");
  for (int i = 0; i < 3; ++i) {
    try {
      if (i == 0) w.scalar("loss", 1, 2, 3.0);
      if (i == 1) w.flush();
      if (i == 2) w.close();
      ADD_FAILURE() << "call " << i << " did not throw";
    } catch (const IoError& e) {
      EXPECT_EQ(e.what(), what) << i;
    }
  }
}

}  // namespace
}  // namespace aiacc::app
