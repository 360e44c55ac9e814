// torch.save's zip archives (models/torch_unpickler.h: readTorchSave, readTorchSaveBytes,
// isTorchScriptArchive): LibTorch's zip reader (PyTorchStreamReader, over miniz) gives the
// records, after checkZipClaims has bounded what they can make it allocate.
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "aiacc/common/error.h"
#include "models/torch_unpickler.h"

namespace aiacc::models {
namespace {

// s for a message: printable ASCII, at most 60 bytes.
std::string printable(const std::string& s) {
  std::string out = s.substr(0, 60);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return s.size() > 60 ? out + "..." : out;
}

}  // namespace

void checkZipClaims(const std::string& bytes, const std::string& name) {
  const uint64_t n = bytes.size();
  const auto bad = [&](const std::string& why) {
    AIACC_THROW(InputError, "'", name, "' is not a valid zip archive: ", why);
  };
  const auto need = [&](uint64_t at, uint64_t len) {
    if (at > n || len > n - at) bad("a record reaches past the end of the file");
  };
  const auto le = [&](uint64_t at, int len) {
    need(at, static_cast<uint64_t>(len));
    uint64_t v = 0;
    for (int i = len; i-- > 0;) v = v << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(at) + i]);
    return v;
  };
  const auto sig = [&](uint64_t at, const char* s) {
    return at <= n && n - at >= 4 && bytes.compare(at, 4, s, 4) == 0;
  };
  // The end of central directory record: the last one within the final 22 + 65535 bytes (its
  // comment may take 65535), as miniz looks for it.
  if (n < 22) bad("too short");
  uint64_t eocd = n;
  for (uint64_t i = n - 22 + 1; i-- > (n > 22 + 65535 ? n - 22 - 65535 : 0);) {
    if (sig(i, "PK\x05\x06")) {
      eocd = i;
      break;
    }
  }
  if (eocd == n) bad("no end of central directory");
  uint64_t entries = le(eocd + 10, 2), cd_size = le(eocd + 12, 4), cd_at = le(eocd + 16, 4);
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_at == 0xFFFFFFFF) {  // zip64: its own end record
    if (eocd < 20 || !sig(eocd - 20, "PK\x06\x07")) bad("a zip64 archive without its locator");
    const uint64_t z = le(eocd - 20 + 8, 8);
    if (!sig(z, "PK\x06\x06")) bad("no zip64 end of central directory");
    entries = le(z + 32, 8);
    cd_size = le(z + 40, 8);
    cd_at = le(z + 48, 8);
  }
  need(cd_at, cd_size);
  uint64_t p = cd_at;
  for (uint64_t e = 0; e < entries; ++e) {
    if (p + 46 > cd_at + cd_size || !sig(p, "PK\x01\x02")) bad("a central directory entry is missing or damaged");
    uint64_t uncompressed = le(p + 24, 4);
    const uint64_t name_len = le(p + 28, 2), extra_len = le(p + 30, 2), comment_len = le(p + 32, 2);
    // The zip64 extra field (id 1) holds the sizes that the entry's own fields mark 0xFFFFFFFF,
    // the uncompressed size first.
    const uint64_t extra = p + 46 + name_len;
    need(extra, extra_len);
    for (uint64_t x = extra; x + 4 <= extra + extra_len;) {
      const uint64_t id = le(x, 2), len = le(x + 2, 2);
      if (id == 1 && uncompressed == 0xFFFFFFFF && len >= 8) uncompressed = le(x + 4, 8);
      x += 4 + len;
    }
    if (uncompressed > n) {
      AIACC_THROW(InputError, "'", name, "': a zip entry claims ", uncompressed, " bytes, more than the archive's ", n,
                  " (torch.save stores its records uncompressed)");
    }
    p = extra + extra_len + comment_len;
  }
}

namespace {

// The archive's data.pkl run against its data/<key> records; `name` is what messages call it.
Unpickled readArchive(const std::function<std::unique_ptr<caffe2::serialize::PyTorchStreamReader>()>& open,
                      const std::string& name) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::string pickle;
  try {
    reader = open();
    AIACC_CHECK_INPUT(!reader->hasRecord("constants.pkl"), "'", name,
                      "' is a TorchScript archive (torch.jit.save, or an aiacc checkpoint of format 2 to 4), not "
                      "a file torch.save wrote");
    AIACC_CHECK_INPUT(reader->hasRecord("data.pkl"), "'", name,
                      "' is a zip archive without data.pkl, not a file "
                      "torch.save wrote");
    if (reader->hasRecord("byteorder")) {
      const auto [data, n] = reader->getRecord("byteorder");
      const std::string order(static_cast<const char*>(data.get()), n);
      AIACC_CHECK_INPUT(order == "little", "'", name, "' was saved ", printable(order),
                        "-endian; aiacc reads little-endian");
    }
    const auto [data, n] = reader->getRecord("data.pkl");
    pickle.assign(static_cast<const char*>(data.get()), n);
  } catch (const c10::Error& e) {
    AIACC_THROW(IoError, "cannot read '", name, "' as a torch.save archive: ", firstLine(e.what_without_backtrace()));
  }
  const StorageLoader load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const std::string record = "data/" + key;
    AIACC_CHECK_INPUT(reader->hasRecord(record), "'", name, "' has no record ", record);
    const auto [data, n] = reader->getRecord(record);
    // The record's bytes bound the storage before anything is allocated for it.
    uint64_t want;
    AIACC_CHECK_INPUT(!__builtin_mul_overflow(static_cast<uint64_t>(numel), c10::elementSize(dtype), &want) &&
                          n >= want,
                      "'", name, "': record ", record, " holds ", n, " bytes, its storage of ", numel, " ",
                      c10::toString(dtype), " elements needs more");
    at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (want > 0) std::memcpy(t.data_ptr(), data.get(), want);
    return t;
  };
  try {
    return unpickleTorch(pickle, load);
  } catch (const InputError& e) {
    AIACC_THROW(InputError, "'", name, "': ", e.what());
  } catch (const c10::Error& e) {
    AIACC_THROW(IoError, "cannot read '", name, "': ", firstLine(e.what_without_backtrace()));
  }
}

}  // namespace

Unpickled readTorchSave(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AIACC_CHECK_IO(in.good(), "cannot open '", path, "'");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  AIACC_CHECK_IO(!in.bad(), "cannot read '", path, "'");
  return readTorchSaveBytes(bytes, path);
}

Unpickled readTorchSaveBytes(const std::string& bytes, const std::string& name) {
  checkZipClaims(bytes, name);
  std::istringstream in(bytes);
  return readArchive([&] { return std::make_unique<caffe2::serialize::PyTorchStreamReader>(&in); }, name);
}

bool isTorchScriptArchive(const std::string& bytes) {
  if (bytes.compare(0, 4, "PK\x03\x04") != 0) return false;
  try {
    checkZipClaims(bytes, "");
    std::istringstream in(bytes);
    return caffe2::serialize::PyTorchStreamReader(&in).hasRecord("constants.pkl");
  } catch (const c10::Error&) {
    return false;
  } catch (const InputError&) {  // (its reader says so)
    return false;
  }
}

}  // namespace aiacc::models
