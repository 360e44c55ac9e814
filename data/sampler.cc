#include "data/sampler.h"

#include <numeric>

#include "aiacc/common/error.h"
#include "data/transforms.h"

namespace aiacc::data {

std::vector<int64_t> shardIndices(int64_t n, int64_t epoch, const ShardSpec& spec) {
  AIACC_CHECK(spec.world >= 1 && spec.rank >= 0 && spec.rank < spec.world, "rank ", spec.rank, " world ", spec.world);
  AIACC_CHECK(spec.offset >= 0 && spec.offset <= n, "offset ", spec.offset, " outside an epoch of ", n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (spec.shuffle) {
    Rng rng(mixSeed(spec.seed, static_cast<uint64_t>(epoch), 0x5348554646ull));  // "SHUFF"
    for (int64_t i = n - 1; i > 0; --i) {                                        // Fisher-Yates
      const int64_t j = rng.randint(0, i + 1);
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  const int64_t rest = n - spec.offset;
  const int64_t used = spec.offset + (spec.equal_shards ? (rest / spec.world) * spec.world : rest);
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(rest / spec.world + 1));
  for (int64_t i = spec.offset + spec.rank; i < used; i += spec.world) shard.push_back(order[static_cast<size_t>(i)]);
  return shard;
}

int64_t batchCount(int64_t shard_size, int64_t batch_size, bool drop_last) {
  AIACC_CHECK(batch_size > 0, "batch size ", batch_size);
  return drop_last ? shard_size / batch_size : (shard_size + batch_size - 1) / batch_size;
}

}  // namespace aiacc::data
