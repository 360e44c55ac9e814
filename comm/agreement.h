// Agreement before the first step: every rank's job settings (the options that shape the
// sequence of collectives, the steps per epoch, a fingerprint of the dataset) compared across
// ranks, so that ranks started differently end at once with a message naming the first differing
// rank and setting with both values, instead of running into mismatched collectives.
//
// One exchange through the rendezvous store, before any transport exists (so the settings that
// shape the transports themselves, channels, shared memory, two-level, are covered too), with no
// rank in charge: rank r publishes its settings and compares them with rank r-1's. Ranks 0..r-1
// agree with rank 0 by induction, so the smallest r that differs from its predecessor is the
// first rank that differs from rank 0. Every rank reads one other rank's settings; one atomic
// counter tells every rank, once all arrived, how many differ. Only then (a failing job) does a
// rank look up which.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "aiacc/comm/options.h"

namespace aiacc::comm {

// The first difference between two ranks' settings as one line, e.g. "--allreduce-dtype is bf16
// on rank 3 but fp32 on rank 2 (and ranks 0-1)"; empty when they are equal.
std::string firstDifference(const Settings& mine, int my_rank, const Settings& theirs, int their_rank);

// Settings <-> bytes (length-prefixed; any bytes in names and values).
std::string encodeSettings(const Settings& s);
Settings decodeSettings(const std::string& bytes);  // throws Error when malformed

// Collective over the store: every rank of `world` calls it once per `key` with its settings.
// Returns when all ranks hold equal settings. Otherwise throws, on every rank, an InputError
// naming the first rank that differs from rank 0 and the first differing setting with both
// values. A rank that never arrives is a CommError after `timeout` naming the rank awaited.
void agreeAcrossRanks(c10d::Store& store, const WorldInfo& world, const Settings& mine,
                      std::chrono::milliseconds timeout, const std::string& key = "agree");

}  // namespace aiacc::comm
