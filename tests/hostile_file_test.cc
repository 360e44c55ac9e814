// Crafted weight files, pickles, checkpoints and recipes (models/torch_unpickler.h, models/weights.h,
// app/checkpoint.h, common/checkpoint_dir.h, the recipe parser): each worst case the fuzzing found is refused with
// one line naming the cause, and within the memory its bytes justify, checked in a child process
// whose address space is capped (a 2^40-fold expansion or an allocation from a header's claim
// then fails the child instead of being refused).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/output-archive.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "aiacc/common/checkpoint_dir.h"
#include "aiacc/common/error.h"
#include "app/checkpoint.h"
#include "app/flags.h"
#include "data/decode.h"
#include "models/torch_storage.h"
#include "models/torch_unpickler.h"
#include "models/weights.h"
#include "tests/test_util.h"

namespace aiacc::models::hostile_test {
namespace {

using test::contains;

template <size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// A storage of 6 floats 0..5 for every key.
const StorageLoader kArange = [](const std::string&, at::ScalarType, int64_t) { return at::arange(6, at::kFloat); };

// What unpickleTorch says of a pickle: "ok" or the InputError's message.
std::string verdict(const std::string& pickle, const StorageLoader& load = kArange) {
  return test::messageOf<InputError>([&] { unpickleTorch(pickle, load); });
}

// torch._utils._rebuild_tensor_v2(storage '0' of 6 floats, offset 0, size, stride, False, ()).
std::string tensorPickle(const std::string& size_tuple, const std::string& stride_tuple) {
  return bytes("\x80\x02"
               "ctorch._utils\n_rebuild_tensor_v2\n"
               "("
               "(X\x07\x00\x00\x00storage"
               "ctorch\nFloatStorage\nX\x01\x00\x00\x00"
               "0X\x03\x00\x00\x00"
               "cpuK\x06tQK\x00") +
         size_tuple + stride_tuple + bytes("\x89)tR.");
}

// fn's verdict in a child process whose address space may grow by `headroom` bytes at most:
// "child failed" when it died or exceeded it.
std::string withinMemory(size_t headroom, const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "no pipe";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::ifstream status("/proc/self/status");
    size_t vm_kb = 0;
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoul(line.substr(7));
    }
    const rlimit cap{vm_kb * 1024 + headroom, vm_kb * 1024 + headroom};
    setrlimit(RLIMIT_AS, &cap);
    std::string out;
    try {
      out = fn();
    } catch (const std::exception& e) {
      out = std::string("unexpected: ") + e.what();
    }
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "child failed";
}

constexpr size_t kHeadroom = size_t{256} << 20;

TEST(HostilePickle, DeepNestingIsRefusedNotAStackOverflow) {
  // 200,000 lists, each appended into the one below it; the same with tuples and dicts.
  const std::string lists = "\x80\x02" + std::string(200000, ']') + std::string(199999, 'a') + ".";
  EXPECT_TRUE(contains(verdict(lists), "values nested more than 100 deep")) << verdict(lists);
  const std::string tuples = "\x80\x02)" + std::string(200000, '\x85') + ".";
  EXPECT_TRUE(contains(verdict(tuples), "values nested more than 100 deep"));
  const std::string dicts = "\x80\x02}" + repeat(bytes("K\x01}"), 200000) + repeat("s", 200000) + ".";
  EXPECT_TRUE(contains(verdict(dicts), "values nested more than 100 deep")) << verdict(dicts);
  // 100 lists nested in each other are read, 101 refused; the same for tuples.
  EXPECT_EQ(verdict("\x80\x02" + std::string(100, ']') + std::string(99, 'a') + "."), "ok");
  EXPECT_TRUE(contains(verdict("\x80\x02" + std::string(101, ']') + std::string(100, 'a') + "."), "nested"));
  EXPECT_EQ(verdict("\x80\x02)" + std::string(99, '\x85') + "."), "ok");
  EXPECT_TRUE(contains(verdict("\x80\x02)" + std::string(100, '\x85') + "."), "nested"));
}

TEST(HostilePickle, SharedValuesStaySharedAndTheirExpansionIsBounded) {
  // 40 (DUP, TUPLE2) pairs: 2^40 leaves if copied; refused once a walk would pass the bound.
  const std::string doubling = bytes("\x80\x02)") + repeat(bytes("2\x86"), 40) + ".";
  const std::string e = verdict(doubling);
  EXPECT_TRUE(contains(e, "items with its shared parts counted each time")) << e;
  // Ten pairs are read, the two halves of each tuple one object.
  const c10::IValue ten = unpickleTorch(bytes("\x80\x02)") + repeat(bytes("2\x86"), 10) + ".", kArange).value;
  const auto& halves = ten.toTupleRef().elements();
  EXPECT_TRUE(halves[0].isSameIdentity(halves[1]));
  EXPECT_EQ(withinMemory(kHeadroom, [&] { return verdict(doubling); }), e);
}

TEST(HostilePickle, NoValueContainsItselfAndKeysAreHashable) {
  EXPECT_TRUE(contains(verdict(bytes("\x80\x02]2a.")), "a list or dict made an item of itself"));
  // M appended into L, then L into M.
  EXPECT_TRUE(contains(verdict(bytes("\x80\x02]q\x00]q\x01"
                                     "ah\x01h\x00"
                                     "a.")),
                       "already an item of another value"));
  EXPECT_TRUE(contains(verdict(bytes("\x80\x02}NK\x01s.")), "a dict key that is a None"))
      << verdict(bytes("\x80\x02}NK\x01s."));
  EXPECT_EQ(verdict(bytes("\x80\x02}K\x07K\x01s.")), "ok");
}

TEST(HostilePickle, TensorViewsMustLieInsideTheirStorageAndNotOverlap) {
  EXPECT_EQ(verdict(tensorPickle(bytes("K\x02K\x03\x86"), bytes("K\x03K\x01\x86"))), "ok");  // 2x3
  EXPECT_EQ(verdict(tensorPickle(bytes("K\x03K\x02\x86"), bytes("K\x01K\x03\x86"))), "ok");  // its transpose
  EXPECT_EQ(verdict(tensorPickle(bytes("K\x01K\x06\x86"), bytes("K\x00K\x01\x86"))), "ok");  // size-1 dim, any stride
  // Broadcast (stride 0) and overlapping views.
  std::string e = verdict(tensorPickle(bytes("K\x03\x85"), bytes("K\x00\x85")));
  EXPECT_TRUE(contains(e, "elements overlap or interleave (stride 0 over 3 elements")) << e;
  e = verdict(tensorPickle(bytes("K\x03K\x02\x86"), bytes("K\x01K\x01\x86")));
  EXPECT_TRUE(contains(e, "elements overlap")) << e;
  // 2^62 + 1 elements of stride 2: the extent overflows int64.
  e = verdict(tensorPickle(bytes("\x8a\x08\x01\x00\x00\x00\x00\x00\x00\x40\x85"), bytes("K\x02\x85")));
  EXPECT_TRUE(contains(e, "reaching past 2^63 elements")) << e;
  // The rule itself (models/torch_storage.h): interleaved views refused, empty ones read anywhere.
  EXPECT_TRUE(contains(viewRefusal({2, 3}, {3, 2}, 0, 100), "overlap or interleave"));
  EXPECT_EQ(viewRefusal({2, 3}, {1, 2}, 0, 6), "");
  EXPECT_EQ(viewRefusal({0, 5}, {1, 1}, 999, 6), "");
  EXPECT_EQ(viewRefusal({0, -1}, {1, 1}, 0, 6), "a negative size or stride");
  e = verdict(tensorPickle(bytes("K\x07\x85"), bytes("K\x01\x85")));
  EXPECT_TRUE(contains(e, "reaching past its storage of 6 elements")) << e;
}

// A torch.save archive whose data.pkl is a tensor of storage '0' with `numel` elements and whose
// data/0 record holds 24 bytes.
std::string archiveClaiming(const std::string& numel_op) {
  std::string pickle = bytes("\x80\x02"
                             "ctorch._utils\n_rebuild_tensor_v2\n"
                             "("
                             "(X\x07\x00\x00\x00storage"
                             "ctorch\nFloatStorage\nX\x01\x00\x00\x00"
                             "0X\x03\x00\x00\x00"
                             "cpu") +
                       numel_op + bytes("tQK\x00K\x06\x85K\x01\x85\x89)tR.");
  std::string zip;
  caffe2::serialize::PyTorchStreamWriter w([&](const void* p, size_t n) {
    zip.append(static_cast<const char*>(p), n);
    return n;
  });
  w.writeRecord("data.pkl", pickle.data(), pickle.size());
  const float six[6] = {0, 1, 2, 3, 4, 5};
  w.writeRecord("data/0", six, sizeof six);
  w.writeEndOfFile();
  return zip;
}

std::string archiveVerdict(const std::string& zip) {
  try {
    readTorchSaveBytes(zip, "w.pt");
  } catch (const InputError& e) {
    return e.what();
  }
  return "ok";
}

TEST(HostilePickle, AStorageLargerThanItsRecordIsRefusedBeforeItIsAllocated) {
  EXPECT_EQ(archiveVerdict(archiveClaiming(bytes("K\x06"))), "ok");
  const std::string huge = archiveClaiming(bytes("\x8a\x07\x00\x00\x00\x00\x00\x00\x04"));  // 2^50
  const std::string e = archiveVerdict(huge);
  EXPECT_TRUE(contains(e, "'w.pt': record data/0 holds 24 bytes, its storage of 1125899906842624 Float elements")) << e;
  EXPECT_EQ(withinMemory(kHeadroom, [&] { return archiveVerdict(huge); }), e);
  // 2^62 elements of 4 bytes: the byte count overflows.
  EXPECT_TRUE(contains(archiveVerdict(archiveClaiming(bytes("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40"))),
                       "holds 24 bytes"));
}

// A zip entry claiming more bytes than the archive (a deflate bomb, or a zip64 size field) is
// refused before LibTorch's zip reader allocates what it claims.
TEST(HostilePickle, AZipEntryClaimingMoreThanTheArchiveIsRefused) {
  std::string zip = archiveClaiming(bytes("K\x06"));
  EXPECT_NO_THROW(checkZipClaims(zip, "w.pt"));
  // The central directory entry of data.pkl: its uncompressed size set to 2^32 - 2.
  const size_t cd = zip.rfind(std::string("PK\x01\x02", 4));
  ASSERT_NE(cd, std::string::npos);
  zip.replace(cd + 24, 4, std::string("\xfe\xff\xff\xff", 4));
  std::string e;
  try {
    checkZipClaims(zip, "w.pt");
  } catch (const InputError& x) {
    e = x.what();
  }
  EXPECT_TRUE(contains(e, "'w.pt': a zip entry claims 4294967294 bytes, more than the archive's")) << e;
  EXPECT_EQ(archiveVerdict(zip), e);
  EXPECT_EQ(withinMemory(kHeadroom, [&] { return archiveVerdict(zip); }), e);
  EXPECT_TRUE(contains(archiveVerdict(zip.substr(0, zip.size() - 30)), "is not a valid zip archive"));
}

// An AIACCW01 weights file (models/weights.h) of one tensor: its name, dtype code and shape.
std::string weightsFile(const std::string& name, uint32_t dtype, const std::vector<int64_t>& shape) {
  std::string f = "AIACCW01";
  auto put = [&](auto v) { f.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint64_t{1});
  put(static_cast<uint32_t>(name.size()));
  f += name;
  put(dtype);
  put(static_cast<uint32_t>(shape.size()));
  for (int64_t n : shape) put(n);
  return f;
}

TEST(HostilePickle, AWeightsFileShapeIsCheckedAgainstItsSizeBeforeAllocating) {
  test::TempDir d;
  test::writeText(d / "w.bin", weightsFile("w", 0, {int64_t{1} << 40, int64_t{1} << 40}));
  auto read = [&] { return test::messageOf<InputError>([&] { readNamedTensors(d / "w.bin"); }); };
  const std::string e = read();
  EXPECT_TRUE(contains(e, "is corrupt at 'w' (a shape larger than the file)")) << e;
  EXPECT_EQ(withinMemory(kHeadroom, read), e);
  // A name with a line break (found by fuzz/fuzz_torch_save): the error stays one line.
  test::writeText(d / "w.bin", weightsFile("a\nb\x01", 7, {}));
  const std::string e2 = read();
  EXPECT_EQ(e2, "weights file '" + (d / "w.bin") + "' is corrupt at 'a\\nb?'");
}

TEST(HostilePickle, CountsInACheckpointAreRangeCheckedBeforeNarrowing) {
  for (double bad : {1e300, -1.0, 2.5, std::nan("")}) {
    at::Tensor evals = at::zeros({1, 7}, at::kDouble);
    evals[0][0] = bad;
    try {
      app::evalsFrom(evals);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_TRUE(contains(e.what(), "evaluation history: step")) << e.what();
    }
  }
  at::Tensor ok = at::zeros({1, 7}, at::kDouble);
  ok[0][0] = 9007199254740992.0;
  EXPECT_EQ(app::evalsFrom(ok)[0].step, int64_t{1} << 53);
}

// A JPEG whose frame claims 30000 x 30000 pixels in a few hundred bytes: refused from its header,
// in a child whose address space may grow by 256 MiB (the full-size crop alone is 2.5 GiB).
TEST(HostilePickle, ADecompressionBombIsRefusedWithinMemory) {
  data::RgbImage img{16, 16, std::vector<uint8_t>(16 * 16 * 3, 128)};
  std::vector<uint8_t> jpg = data::encodeJpeg(img, 90);
  for (size_t p = 2; p + 9 < jpg.size(); p += 2 + static_cast<size_t>(jpg[p + 2] << 8 | jpg[p + 3])) {
    if (jpg[p + 1] == 0xC0) {  // the frame: height, then width
      for (size_t i : {p + 5, p + 7}) {
        jpg[i] = 30000 >> 8;
        jpg[i + 1] = 30000 & 0xFF;
      }
      break;
    }
  }
  const auto decode = [&]() -> std::string {
    try {
      data::decodeCrop(
          jpg.data(), jpg.size(),
          [](int w, int h) {
        return data::Box{0, 0, w, h};
          },
          data::kFullResolution, data::kFullResolution);
    } catch (const data::DecodeError& e) {
      return e.what();
    }
    return "decoded";
  };
  const std::string e = withinMemory(kHeadroom, decode);
  EXPECT_TRUE(contains(e, "image of 30000x30000 pixels, above the limit")) << e;
}

// Checkpoint formats 2 to 4 were LibTorch archives, read by LibTorch's TorchScript unpickler;
// no release wrote them, and they are refused in one line instead of parsed by it.
TEST(HostilePickle, ALibTorchArchiveIsRefusedAsACheckpoint) {
  torch::serialize::OutputArchive archive;
  archive.write("format_version", c10::IValue(int64_t{4}));
  std::ostringstream os;
  archive.save_to(os);
  torch::nn::Linear model(2, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  try {
    app::decodeCheckpoint(os.str(), "old.ckpt", *model, sgd);
    ADD_FAILURE() << "read";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot read checkpoint 'old.ckpt': it is a LibTorch archive")) << e.what();
  }
}

// --resume auto's search with the checkpoint decoder as its last word: a whole checkpoint (its
// manifest and CRC-32C intact) whose payload is refused gives way to the one before it, said in
// one line; with none decodable, nothing is found and the newest one's error is kept.
TEST(HostilePickle, AnUndecodableWholeCheckpointFallsBackToThePrevious) {
  test::TempDir d;
  torch::nn::Linear model(2, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  app::TrainingState s;
  s.step = 1;
  CheckpointDir dir(d / "ckpt");
  dir.write(1, app::encodeCheckpoint(*model, sgd, s));
  dir.write(2, archiveClaiming(bytes("\x8a\x07\x00\x00\x00\x00\x00\x00\x04")));  // a 2^50-element storage
  std::vector<std::string> lines, errors;
  const auto decode = [&](const CheckpointFile& f) -> std::string {
    try {
      app::decodeCheckpoint(f.bytes, f.path, *model, sgd);
      return "";
    } catch (const Error& e) {
      errors.push_back(e.what());
      return e.what();
    }
  };
  const auto found = findNewestValid(
      d / "ckpt", [&](const std::string& l) { lines.push_back(l); }, decode);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], d / "ckpt/step-000000000002.ckpt: cannot read checkpoint")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "holds 24 bytes")) << lines[0];
  dir.write(3, "not a zip");
  std::filesystem::remove(d / "ckpt/step-000000000001.ckpt");
  errors.clear();
  EXPECT_FALSE(findNewestValid(d / "ckpt", {}, decode));
  ASSERT_FALSE(errors.empty());
  EXPECT_TRUE(contains(errors[0], "step-000000000003.ckpt")) << errors[0];
}

TEST(HostilePickle, ARecipeNumberOutOfRangeNamesItsLine) {
  test::TempDir d;
  for (const char* line : {"stage 0 size=99999999999", "stage 0 size=12abc", "stage 0 batch=-4", "stage 0 scale=nan"}) {
    test::writeText(d / "r.recipe", std::string("# a recipe\n") + line + "\n");
    try {
      app::applyRecipe(d / "r.recipe", nullptr);
      ADD_FAILURE() << line << " accepted";
    } catch (const InputError& e) {
      EXPECT_TRUE(contains(e.what(), "r.recipe:2: ")) << e.what();
      EXPECT_TRUE(contains(e.what(), "is not a")) << e.what();
    }
  }
}

}  // namespace
}  // namespace aiacc::models::hostile_test
