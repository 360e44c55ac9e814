// KeyLog (comm/key_log.h): every key written through a recording store is recorded, also by a
// library's own prefix store on top of it (as ProcessGroupGloo's rendezvous), and deleted by its
// writer or, for a writer that died, from the list it published; the job's other keys stay.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <memory>
#include <string>
#include <vector>

#include "aiacc/comm/key_log.h"
#include "aiacc/comm/store.h"

namespace aiacc::comm {
namespace {

TEST(KeyLog, EveryKeyWrittenGoesWithItsWriterOrFromItsPublishedList) {
  const auto base = makeHashStore();
  const auto log_a = std::make_shared<KeyLog>(), log_b = std::make_shared<KeyLog>();
  const auto a = makeRecordingPrefixStore("job/g0", base, log_a);
  const auto b = makeRecordingPrefixStore("job/g0", base, log_b);
  const std::vector<uint8_t> v{1}, none;
  a->set("x", v);
  a->add("n", 1);
  a->compareSet("c", none, v);
  a->set("x", v);  // written twice, recorded once
  c10d::PrefixStore library("gloo", a);
  library.set("rank_0", v);
  b->set("y", v);
  b->add("n", 1);  // a counter both wrote: both record it
  EXPECT_EQ(log_a->keys(), (std::vector<std::string>{"x", "n", "c", "gloo/rank_0"}));
  EXPECT_EQ(log_b->keys(), (std::vector<std::string>{"y", "n"}));
  EXPECT_FALSE(a->get("x").empty());  // reads are not writes
  EXPECT_EQ(log_a->keys().size(), 4u);

  const auto generation = c10::make_intrusive<c10d::PrefixStore>("job/g0", base);
  log_a->publish(*generation, "keys/0");
  log_b->publish(*generation, "keys/1");
  base->set("job/g1/z", v);  // the next generation's: not touched
  base->set("job/roster", v);
  EXPECT_EQ(base->getNumKeys(), 9);

  EXPECT_EQ(log_a->deleteOwn(*generation, "keys/0"), 4);
  EXPECT_EQ(KeyLog::deleteKeysOf(*generation, "keys/1"), 1) << "y (n went with a)";
  EXPECT_EQ(KeyLog::deleteKeysOf(*generation, "keys/7"), 0) << "a rank that published nothing";
  EXPECT_EQ(base->getNumKeys(), 2);
  EXPECT_TRUE(base->check({"job/g1/z", "job/roster"}));
}

}  // namespace
}  // namespace aiacc::comm
