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
  std::vector<int64_t> shard;
  if (spec.global_batch > 0) {
    AIACC_CHECK(spec.global_batch >= spec.world, "a global batch of ", spec.global_batch, " cannot be shared by ",
                spec.world, " ranks");
    const int64_t steps = rest / spec.global_batch;
    shard.reserve(static_cast<size_t>(steps * rankBatch(spec.global_batch, spec.rank, spec.world)));
    for (int64_t k = 0; k < steps; ++k) {
      const int64_t first = spec.offset + k * spec.global_batch;
      for (int64_t q = spec.rank; q < spec.global_batch; q += spec.world)
        shard.push_back(order[static_cast<size_t>(first + q)]);
    }
    return shard;
  }
  const int64_t used = spec.offset + (spec.equal_shards ? (rest / spec.world) * spec.world : rest);
  shard.reserve(static_cast<size_t>(rest / spec.world + 1));
  for (int64_t i = spec.offset + spec.rank; i < used; i += spec.world) shard.push_back(order[static_cast<size_t>(i)]);
  return shard;
}

int64_t rankBatch(int64_t global_batch, int rank, int world) {
  AIACC_CHECK(world >= 1 && rank >= 0 && rank < world, "rank ", rank, " world ", world);
  return global_batch / world + (rank < global_batch % world ? 1 : 0);
}

int64_t batchCount(int64_t shard_size, int64_t batch_size, bool drop_last) {
  AIACC_CHECK(batch_size > 0, "batch size ", batch_size);
  return drop_last ? shard_size / batch_size : (shard_size + batch_size - 1) / batch_size;
}

}  // namespace aiacc::data
