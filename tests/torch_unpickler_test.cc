// The restricted unpickler (models/torch_unpickler.h) on pickles Python wrote (embedded bytes from
// Python 3's pickle and torch 1.13's torch.save), and its refusals: truncated input, unknown
// opcodes, memo entries never put, views reaching past their storage.
#include "models/torch_unpickler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "aiacc/common/error.h"
#include "tests/test_util.h"

namespace aiacc::models {
namespace {

// pickle.dumps({'a': -3, 'b': 2.5, 'c': [1, None, True, False], 'd': (1, 'x'), 'big': 2**40,
//               'neg': -2**40, 'k1': 200, 'k2': 60000}, protocol=2)
// pickle.dumps(OrderedDict([('z', 1), ('a', (2, 3, 4)), ('s', 'long' * 3)]), protocol=4)
// data.pkl of torch.save({'x': x, 'mid': x[1:3], 't': x.view(2, 3).t()}) with x = torch.arange(6.)
// pickle.dumps({'only': 1}, protocol=2): one entry is SETITEM, not SETITEMS
const std::string kPlainValues(
    "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x4a\xfd\xff\xff\xff\x58\x01\x00\x00\x00"
    "\x62\x71\x02\x47\x40\x04\x00\x00\x00\x00\x00\x00\x58\x01\x00\x00\x00\x63\x71\x03\x5d\x71\x04\x28"
    "\x4b\x01\x4e\x88\x89\x65\x58\x01\x00\x00\x00\x64\x71\x05\x4b\x01\x58\x01\x00\x00\x00\x78\x71\x06"
    "\x86\x71\x07\x58\x03\x00\x00\x00\x62\x69\x67\x71\x08\x8a\x06\x00\x00\x00\x00\x00\x01\x58\x03\x00"
    "\x00\x00\x6e\x65\x67\x71\x09\x8a\x06\x00\x00\x00\x00\x00\xff\x58\x02\x00\x00\x00\x6b\x31\x71\x0a"
    "\x4b\xc8\x58\x02\x00\x00\x00\x6b\x32\x71\x0b\x4d\x60\xea\x75\x2e",
    136);

const std::string kOrderedProtocol4(
    "\x80\x04\x95\x49\x00\x00\x00\x00\x00\x00\x00\x8c\x0b\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73"
    "\x94\x8c\x0b\x4f\x72\x64\x65\x72\x65\x64\x44\x69\x63\x74\x94\x93\x94\x29\x52\x94\x28\x8c\x01\x7a"
    "\x94\x4b\x01\x8c\x01\x61\x94\x4b\x02\x4b\x03\x4b\x04\x87\x94\x8c\x01\x73\x94\x8c\x0c\x6c\x6f\x6e"
    "\x67\x6c\x6f\x6e\x67\x6c\x6f\x6e\x67\x94\x75\x2e",
    84);

const std::string kThreeViews(
    "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x78\x71\x01\x63\x74\x6f\x72\x63\x68\x2e\x5f\x75\x74"
    "\x69\x6c\x73\x0a\x5f\x72\x65\x62\x75\x69\x6c\x64\x5f\x74\x65\x6e\x73\x6f\x72\x5f\x76\x32\x0a\x71"
    "\x02\x28\x28\x58\x07\x00\x00\x00\x73\x74\x6f\x72\x61\x67\x65\x71\x03\x63\x74\x6f\x72\x63\x68\x0a"
    "\x46\x6c\x6f\x61\x74\x53\x74\x6f\x72\x61\x67\x65\x0a\x71\x04\x58\x01\x00\x00\x00\x30\x71\x05\x58"
    "\x03\x00\x00\x00\x63\x70\x75\x71\x06\x4b\x06\x74\x71\x07\x51\x4b\x00\x4b\x06\x85\x71\x08\x4b\x01"
    "\x85\x71\x09\x89\x63\x63\x6f\x6c\x6c\x65\x63\x74\x69\x6f\x6e\x73\x0a\x4f\x72\x64\x65\x72\x65\x64"
    "\x44\x69\x63\x74\x0a\x71\x0a\x29\x52\x71\x0b\x74\x71\x0c\x52\x71\x0d\x58\x03\x00\x00\x00\x6d\x69"
    "\x64\x71\x0e\x68\x02\x28\x28\x68\x03\x68\x04\x68\x05\x68\x06\x4b\x06\x74\x71\x0f\x51\x4b\x01\x4b"
    "\x02\x85\x71\x10\x4b\x01\x85\x71\x11\x89\x68\x0a\x29\x52\x71\x12\x74\x71\x13\x52\x71\x14\x58\x01"
    "\x00\x00\x00\x74\x71\x15\x68\x02\x28\x28\x68\x03\x68\x04\x68\x05\x68\x06\x4b\x06\x74\x71\x16\x51"
    "\x4b\x00\x4b\x03\x4b\x02\x86\x71\x17\x4b\x01\x4b\x03\x86\x71\x18\x89\x68\x0a\x29\x52\x71\x19\x74"
    "\x71\x1a\x52\x71\x1b\x75\x2e",
    271);

const std::string kOneEntry("\x80\x02\x7d\x71\x00\x58\x04\x00\x00\x00\x6f\x6e\x6c\x79\x71\x01\x4b\x01\x73\x2e", 20);

const StorageLoader kNoStorage = [](const std::string& key, at::ScalarType, int64_t) -> at::Tensor {
  ADD_FAILURE() << "storage " << key << " asked for";
  return {};
};

std::string refusal(const std::string& bytes, const StorageLoader& load = kNoStorage) {
  return test::messageOf<InputError>([&] { unpickleTorch(bytes, load); }, "no InputError");
}

using test::contains;

// A literal's bytes, NULs included.
template <size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

TEST(TorchUnpickler, PlainValuesOfProtocol2) {
  const Unpickled u = unpickleTorch(kPlainValues, kNoStorage);
  ASSERT_TRUE(u.value.isGenericDict());
  const c10::impl::GenericDict d = u.value.toGenericDict();
  ASSERT_EQ(d.size(), 8u);
  std::vector<std::string> keys;
  for (const auto& kv : d) keys.push_back(kv.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b", "c", "d", "big", "neg", "k1", "k2"})) << "insertion order";
  EXPECT_EQ(d.at("a").toInt(), -3);
  EXPECT_EQ(d.at("b").toDouble(), 2.5);
  const c10::List<c10::IValue> c = d.at("c").toList();
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c.get(0).toInt(), 1);
  EXPECT_TRUE(c.get(1).isNone());
  EXPECT_TRUE(c.get(2).toBool());
  EXPECT_FALSE(c.get(3).toBool());
  const auto t = d.at("d").toTuple();
  ASSERT_EQ(t->elements().size(), 2u);
  EXPECT_EQ(t->elements()[0].toInt(), 1);
  EXPECT_EQ(t->elements()[1].toStringRef(), "x");
  EXPECT_EQ(d.at("big").toInt(), int64_t{1} << 40);
  EXPECT_EQ(d.at("neg").toInt(), -(int64_t{1} << 40));
  EXPECT_EQ(d.at("k1").toInt(), 200);
  EXPECT_EQ(d.at("k2").toInt(), 60000);
  EXPECT_TRUE(u.opaque_types.empty());

  const Unpickled one = unpickleTorch(kOneEntry, kNoStorage);
  EXPECT_EQ(one.value.toGenericDict().at("only").toInt(), 1);
}

TEST(TorchUnpickler, OrderedDictOfProtocol4) {
  const Unpickled u = unpickleTorch(kOrderedProtocol4, kNoStorage);
  ASSERT_TRUE(u.value.isGenericDict());
  const c10::impl::GenericDict d = u.value.toGenericDict();
  std::vector<std::string> keys;
  for (const auto& kv : d) keys.push_back(kv.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{"z", "a", "s"}));
  EXPECT_EQ(d.at("a").toTuple()->elements().size(), 3u);
  EXPECT_EQ(d.at("a").toTuple()->elements()[2].toInt(), 4);
  EXPECT_EQ(d.at("s").toStringRef(), "longlonglong");
}

TEST(TorchUnpickler, ViewsShareOneStorage) {
  int loads = 0;
  const StorageLoader arange = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    ++loads;
    EXPECT_EQ(key, "0");
    EXPECT_EQ(dtype, at::kFloat);
    return at::arange(numel, at::kFloat);
  };
  const c10::impl::GenericDict d = unpickleTorch(kThreeViews, arange).value.toGenericDict();
  EXPECT_EQ(loads, 1) << "one storage for the three views";
  const at::Tensor x = d.at("x").toTensor(), mid = d.at("mid").toTensor(), t = d.at("t").toTensor();
  EXPECT_TRUE(x.equal(at::arange(6, at::kFloat)));
  EXPECT_TRUE(mid.equal(at::arange(1, 3, at::kFloat)));
  EXPECT_TRUE(t.equal(at::arange(6, at::kFloat).view({2, 3}).t()));
  EXPECT_EQ(t.strides(), (c10::IntArrayRef{1, 3}));
  EXPECT_EQ(x.data_ptr(), t.data_ptr());

  const StorageLoader short_storage = [](const std::string&, at::ScalarType, int64_t) {
    return at::zeros({4}, at::kFloat);
  };
  EXPECT_TRUE(contains(refusal(kThreeViews, short_storage), "reaching past its storage of 4 elements"));
}

TEST(TorchUnpickler, MalformedPicklesAreOneLineRefusals) {
  const std::string truncated = kPlainValues.substr(0, 40);
  std::string e = refusal(truncated);
  EXPECT_TRUE(contains(e, "ends")) << e;
  EXPECT_EQ(refusal(kPlainValues.substr(0, kPlainValues.size() - 1)), "the pickle ends without STOP at byte 135");
  e = refusal(bytes("\x80\x02\x68\x05."));  // BINGET 5 with nothing put
  EXPECT_EQ(e, "pickle opcode 0x68 at byte 2: a memo entry that was never put");
  // os.system('ls'): an unknown call is read as an opaque value, never run.
  const Unpickled os = unpickleTorch(bytes("\x80\x02\x63os\nsystem\n\x58\x02\x00\x00\x00ls\x85R."), kNoStorage);
  EXPECT_TRUE(os.value.isNone());
  EXPECT_EQ(os.opaque_types, (std::vector<std::string>{"os.system"}));
  e = refusal(bytes("\x80\x02I1\n."));  // INT (protocol 0 text)
  EXPECT_EQ(e, "pickle opcode 0x49 at byte 2: not one torch.save writes for tensors and plain values");
  e = refusal(bytes("\x80\x02\x8a\x09\x01\x02\x03\x04\x05\x06\x07\x08\x09."));
  EXPECT_TRUE(contains(e, "does not fit 64 bits")) << e;
  e = refusal(bytes("\x80\x02u."));
  EXPECT_TRUE(contains(e, "no MARK")) << e;
  // EMPTY_TUPLE wrapped in 1500 TUPLE1s: refused, not a C++ stack overflow.
  e = refusal(bytes("\x80\x02)") + std::string(1500, '\x85') + ".");
  EXPECT_TRUE(contains(e, "values nested more than 100 deep")) << e;
  for (const std::string& bad : {truncated, bytes("\x80\x02u.")}) {
    EXPECT_FALSE(contains(refusal(bad), "\n"));
  }
}

}  // namespace
}  // namespace aiacc::models
