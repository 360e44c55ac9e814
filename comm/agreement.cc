#include "aiacc/comm/agreement.h"

#include <cstdint>

#include "aiacc/comm/transport.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {
namespace {

void putLength(std::string& out, size_t n) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
}

size_t getU32(const std::string& in, size_t& at) {
  AIACC_CHECK(at + 4 <= in.size(), "settings truncated at byte ", at);
  size_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<size_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  at += 4;
  return n;
}

// A length-prefixed string.
std::string getString(const std::string& in, size_t& at) {
  const size_t n = getU32(in, at);
  AIACC_CHECK(n <= in.size() - at, "settings truncated at byte ", at);
  std::string s = in.substr(at, n);
  at += n;
  return s;
}

std::string ranksBefore(int rank) {
  if (rank <= 1) return "";
  return rank == 2 ? " (and rank 0)" : strCat(" (and ranks 0-", rank - 2, ")");
}

std::vector<uint8_t> bytesOf(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// Waits for `k` and reads it; a timeout (or the store gone) names what was awaited.
std::string await(c10d::Store& store, const std::string& k, std::chrono::milliseconds timeout,
                  const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    store.wait({k}, timeout);
    const std::vector<uint8_t> v = store.get(k);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    if (std::chrono::steady_clock::now() - t0 < timeout) {
      throw CommError(strCat("lost the rendezvous store while waiting for ", what, " (", why, "); is rank 0 running?"),
                      CommError::Remedy::kStore);
    }
    throw CommError(strCat("timed out after ", timeout.count() / 1000.0, " s waiting for ", what, " (", why,
                           "); did every rank start, with the same store address?"),
                    CommError::Remedy::kStore);
  }
}

}  // namespace

std::string encodeSettings(const Settings& s) {
  std::string out = "aiacc-settings-1";
  putLength(out, s.size());
  for (const Setting& x : s) {
    putLength(out, x.name.size());
    out += x.name;
    putLength(out, x.value.size());
    out += x.value;
  }
  return out;
}

Settings decodeSettings(const std::string& in) {
  static const std::string kMagic = "aiacc-settings-1";
  AIACC_CHECK(in.compare(0, kMagic.size(), kMagic) == 0, "not an aiacc settings record (another aiacc version?)");
  size_t at = kMagic.size();
  const size_t n = getU32(in, at);
  Settings s;
  for (size_t i = 0; i < n; ++i) {
    Setting x;
    x.name = getString(in, at);
    x.value = getString(in, at);
    s.push_back(std::move(x));
  }
  AIACC_CHECK(at == in.size(), "settings record has ", in.size() - at, " trailing bytes");
  return s;
}

std::string firstDifference(const Settings& mine, int my_rank, const Settings& theirs, int their_rank) {
  const std::string also = their_rank + 1 == my_rank ? ranksBefore(my_rank) : "";
  const size_t n = std::min(mine.size(), theirs.size());
  for (size_t i = 0; i < n; ++i) {
    if (mine[i].name != theirs[i].name) {
      return strCat("rank ", my_rank, " sends setting '", mine[i].name, "' where rank ", their_rank, " sends '",
                    theirs[i].name, "' (different aiacc builds?)");
    }
    if (mine[i].value != theirs[i].value) {
      return strCat(mine[i].name, " is ", mine[i].value, " on rank ", my_rank, " but ", theirs[i].value, " on rank ",
                    their_rank, also);
    }
  }
  if (mine.size() != theirs.size()) {
    return strCat("rank ", my_rank, " has ", mine.size(), " settings but rank ", their_rank, " has ", theirs.size(),
                  " (different aiacc builds?)");
  }
  return "";
}

void agreeAcrossRanks(c10d::Store& store, const WorldInfo& world, const Settings& mine,
                      std::chrono::milliseconds timeout, const std::string& key) {
  if (world.world <= 1) return;
  const int r = world.rank, w = world.world;
  const std::string blob = encodeSettings(mine);
  store.set(strCat(key, "/settings/", r), bytesOf(blob));
  bool differs = false;
  if (r > 0) {
    const std::string prev = await(store, strCat(key, "/settings/", r - 1), timeout,
                                   strCat("rank ", r - 1, "'s job settings"));
    differs = prev != blob;
    if (differs) store.set(strCat(key, "/differs/", r), std::vector<uint8_t>{1});
  }
  // arrivals + K * (ranks that differ), K > world: both read from one atomic counter.
  const int64_t K = w + 1;
  const int64_t v = store.add(key + "/count", differs ? 1 + K : 1);
  if (v % K == w) store.set(key + "/all", bytesOf(std::to_string(v)));
  const int64_t total = std::stoll(await(store, key + "/all", timeout, "every rank's job settings"));
  const int64_t n_differ = total / K;
  if (n_differ == 0) return;
  std::string first;
  for (int q = 1; q < w && first.empty(); ++q) {
    if (!store.check({strCat(key, "/differs/", q)})) continue;
    const Settings a = decodeSettings(await(store, strCat(key, "/settings/", q), timeout, "settings"));
    const Settings b = decodeSettings(await(store, strCat(key, "/settings/", q - 1), timeout, "settings"));
    first = firstDifference(a, q, b, q - 1);
  }
  // Everyone has read what it needed before anyone leaves: the store may live in rank 0.
  if (store.add(key + "/read", 1) == w) store.set(key + "/all-read", std::vector<uint8_t>{1});
  try {
    store.wait({key + "/all-read"}, timeout);
  } catch (const std::exception&) {
    // a rank died after counting: the message below still holds
  }
  if (first.empty())
    AIACC_THROW(CommError, "job settings differ on ", n_differ, " rank(s), but none marked itself (store reset?)");
  AIACC_THROW(InputError, "ranks were started with different settings: ", first,
              n_differ > 1 ? strCat("; ", n_differ, " ranks differ from their predecessor") : std::string(),
              " (start every rank with the same options and dataset)");
}

}  // namespace aiacc::comm
