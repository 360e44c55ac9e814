// Epoch-seeded shuffling and sharding by (rank, world).
//
// Training shards are equal in size on every rank (n / world samples each; the remainder, at
// most world-1 samples, changes from epoch to epoch with the shuffle), so every rank runs the
// same number of steps, a requirement of synchronous data parallelism. Evaluation shards keep
// every sample exactly once (sizes differ by at most one); metrics are summed across ranks.
#pragma once

#include <cstdint>
#include <vector>

namespace aiacc::data {

struct ShardSpec {
  int rank = 0;
  int world = 1;
  bool shuffle = true;       // permute with a seed derived from (seed, epoch)
  bool equal_shards = true;  // drop the n % world remainder (training)
  uint64_t seed = 0;
  // Positions of the epoch's order already consumed by an earlier world (an elastic job that
  // changed its world mid-epoch): this world shares out the rest, order[offset..], the same way
  // (rank r takes offset + r, offset + r + world, ...). So the worlds of an epoch together see
  // each sample once, less a tail smaller than the last world.
  int64_t offset = 0;
  // > 0 (training only): the order from `offset` on is consumed in steps of global_batch positions
  // shared by all ranks, which need not divide it (an elastic job that keeps its global batch in
  // another world, --elastic-batch keep-global): position q of each step goes to rank q % world,
  // so rank r takes rankBatch(global_batch, r, world) of every step, and the last partial step is
  // dropped. Where world divides global_batch this is the layout above, less its partial batches.
  int64_t global_batch = 0;
};

// Rank `rank`'s share of a global batch split over `world` ranks: global_batch / world, one more
// for the first global_batch % world ranks (the shares sum to global_batch).
int64_t rankBatch(int64_t global_batch, int rank, int world);

// This rank's sample indices for the epoch, in the order they are to be consumed.
// Pure function of its arguments: identical on every rank and every run.
std::vector<int64_t> shardIndices(int64_t n, int64_t epoch, const ShardSpec& spec);

// Batches in a shard of `shard_size` samples: floor when drop_last (training), ceil otherwise.
int64_t batchCount(int64_t shard_size, int64_t batch_size, bool drop_last);

}  // namespace aiacc::data
