#include "models/torch_unpickler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <variant>

#include "aiacc/common/error.h"
#include "models/torch_storage.h"

namespace aiacc::models {
namespace {

// A value on the machine's stack. Tuples stay the machine's own until they land in a container
// or are returned, because a tuple may hold a class (the storage id ('storage', FloatStorage,
// ...)), which is no IValue.
struct Global {
  std::string name;  // "module.qualname"
};
struct Opaque {
  std::string type;
};
struct Tuple;
struct Obj {
  std::variant<c10::IValue, Global, std::shared_ptr<Tuple>, Opaque> v;
};

// A value's shape, for the bounds in torch_unpickler.h: how deep containers nest in it and how
// many values it holds with every shared part counted each time it appears (what a walk over
// it visits).
struct Shape {
  int height = 0;      // 0 for a leaf, 1 + the deepest item's height for a container
  uint64_t nodes = 1;  // itself and its items' nodes
};

// A tuple is immutable: its items were complete when it was made, so its shape is known then.
struct Tuple {
  std::vector<Obj> items;
  Shape shape;
};

constexpr int kMaxDepth = kMaxPickleDepth;
constexpr size_t kMaxNamePart = 256;    // a global's module or name, in bytes
constexpr size_t kMaxOpaqueTypes = 16;  // unread types named in Unpickled::opaque_types

class Machine {
 public:
  Machine(std::string_view in, const StorageLoader& load)
      : in_(in), load_(load), max_nodes_(static_cast<uint64_t>(in.size()) + kPickleNodeSlack) {}

  Unpickled run() {
    while (true) {
      op_at_ = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') {
        c10::IValue value = toIValue(top());
        return {std::move(value), std::move(opaque_types_)};
      }
      step(op);
    }
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    if (op_at_ >= in_.size()) AIACC_THROW(InputError, "the pickle ends without STOP at byte ", op_at_);
    AIACC_THROW(InputError, "pickle opcode 0x", hex(static_cast<unsigned char>(in_[op_at_])), " at byte ", op_at_, ": ",
                args...);
  }
  template <typename... Args>
  void check(bool cond, const Args&... args) const {
    if (!cond) fail(args...);
  }
  static std::string hex(unsigned char c) {
    const char* digits = "0123456789abcdef";
    return {digits[c >> 4], digits[c & 15]};
  }

  std::string_view take(size_t n) {
    if (n > in_.size() - pos_) fail("the pickle ends early (", in_.size(), " bytes)");
    const std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint64_t unsignedLE(size_t n) {
    const std::string_view s = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(s[i]);
    return v;
  }
  // LONG1 / LONG4: little-endian two's complement of n bytes.
  int64_t signedLE(size_t n) {
    check(n <= 8, "an integer of ", n, " bytes does not fit 64 bits");
    if (n == 0) return 0;
    const uint64_t u = unsignedLE(n);
    if (n == 8) return static_cast<int64_t>(u);
    const uint64_t sign = uint64_t{1} << (8 * n - 1);
    return static_cast<int64_t>((u ^ sign) - sign);
  }
  std::string line() {
    const size_t end = in_.find('\n', pos_);
    check(end != std::string_view::npos, "GLOBAL without its newline");
    std::string s(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  // A global's "module.name": each part a Python identifier's length at most and printable (a
  // name is copied into every value that refers to it, and into messages).
  Obj global(const std::string& module, const std::string& name) {
    for (const std::string* part : {&module, &name}) {
      check(part->size() <= kMaxNamePart, "a global's name of ", part->size(), " bytes (at most ", kMaxNamePart, ")");
      check(std::all_of(part->begin(), part->end(), [](char c) { return c >= 0x20 && c < 0x7f; }),
            "a global's name with a byte that is not printable ASCII");
    }
    return Obj{Global{module + "." + name}};
  }

  Obj pop() {
    check(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()), "the stack is empty");
    Obj o = std::move(stack_.back());
    stack_.pop_back();
    return o;
  }
  Obj& top() {
    check(!stack_.empty(), "the stack is empty");
    return stack_.back();
  }
  std::vector<Obj> popToMark() {
    check(!marks_.empty(), "no MARK before it");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Obj> items(std::make_move_iterator(stack_.begin() + m), std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  void push(c10::IValue v) { stack_.push_back(Obj{std::move(v)}); }
  // A new, empty list or dict: its shape is tracked from here (containers_).
  void pushContainer(c10::IValue v) {
    containers_[v.internalToPointer()] = Container{};  // (a freed one's address may come again)
    push(std::move(v));
  }
  void pushTuple(std::vector<Obj> items) {
    auto t = std::make_shared<Tuple>();
    for (const Obj& item : items) grow(t->shape, adopt(item, nullptr));
    t->items = std::move(items);
    stack_.push_back(Obj{std::move(t)});
  }
  std::shared_ptr<Tuple> tupleOf(Obj o) {
    auto* t = std::get_if<std::shared_ptr<Tuple>>(&o.v);
    check(t != nullptr, "expected a tuple of arguments");
    return *t;
  }

  // The bookkeeping behind the bounds (torch_unpickler.h). A list or dict is frozen once it is an
  // item of another value: nothing is added to it afterwards (torch.save, like every pickler,
  // fills a container before it uses it), so its shape is final when it is adopted, a parent's
  // shape follows from its items' without walking anything, and no value can contain itself.
  struct Container {
    Shape shape;
    bool frozen = false;
  };
  // The shape of `item`, frozen from now on as an item of `parent` (a list or dict; null: a tuple
  // being made).
  Shape adopt(const Obj& item, const void* parent) {
    if (const auto* t = std::get_if<std::shared_ptr<Tuple>>(&item.v)) return (*t)->shape;
    const auto* v = std::get_if<c10::IValue>(&item.v);
    if (!v || !(v->isList() || v->isGenericDict())) return Shape{};
    const void* p = v->internalToPointer();
    check(p != parent, "a list or dict made an item of itself");
    const auto it = containers_.find(p);
    check(it != containers_.end(), "a list or dict the pickle did not make");
    it->second.frozen = true;
    return it->second.shape;
  }
  // Adds an item's shape to a container's, within the bounds.
  void grow(Shape& shape, const Shape& item) {
    check(item.height + 1 < kMaxDepth, "values nested more than ", kMaxDepth, " deep");
    shape.height = std::max(shape.height, item.height + 1);
    shape.nodes += item.nodes;
    check(shape.nodes <= max_nodes_, "a value of more than ", max_nodes_,
          " items with its shared parts counted each time (the pickle's bytes + ", kPickleNodeSlack, ")");
  }
  // The tracked record of the list or dict `target` that items are added to; refused once frozen.
  Container& growing(const c10::IValue& target) {
    const auto it = containers_.find(target.internalToPointer());
    check(it != containers_.end(), "a list or dict the pickle did not make");
    check(!it->second.frozen, "items added to a list or dict that is already an item of another value");
    return it->second;
  }
  const c10::IValue& ivalue(const Obj& o, const char* what) {
    const auto* v = std::get_if<c10::IValue>(&o.v);
    check(v != nullptr, "expected ", what);
    return *v;
  }

  // The IValue of o. A tuple is converted once, however many times the pickle refers to it, so
  // that shared tuples stay shared (copies of them could grow as 2^depth); its height is bounded
  // (pushTuple), and so is this recursion.
  c10::IValue toIValue(const Obj& o) {
    if (const auto* v = std::get_if<c10::IValue>(&o.v)) return *v;
    if (const auto* t = std::get_if<std::shared_ptr<Tuple>>(&o.v)) {
      const auto done = tuples_.find(t->get());
      if (done != tuples_.end()) return done->second;
      std::vector<c10::IValue> items;
      items.reserve((*t)->items.size());
      for (const Obj& e : (*t)->items) items.push_back(toIValue(e));
      c10::IValue tuple = c10::ivalue::Tuple::create(std::move(items));
      tuples_.emplace(t->get(), tuple);
      keep_.push_back(*t);  // the key's address stays this tuple's
      return tuple;
    }
    const std::string type = std::holds_alternative<Global>(o.v) ? "class " + std::get<Global>(o.v).name
                                                                 : std::get<Opaque>(o.v).type;
    // Named once each, the first kMaxOpaqueTypes of them (they only feed a message).
    if (opaque_types_.size() < kMaxOpaqueTypes &&
        std::find(opaque_types_.begin(), opaque_types_.end(), type) == opaque_types_.end()) {
      opaque_types_.push_back(type);
    }
    return c10::IValue();
  }

  void setItems(std::vector<Obj> items) {
    check(items.size() % 2 == 0, "SETITEMS with an odd number of values");
    const c10::IValue& target = ivalue(top(), "a dict to set items in");
    if (!target.isGenericDict()) {
      check(target.isNone(), "items set in a ", target.tagKind());
      return;  // an opaque object's items
    }
    Container& c = growing(target);
    c10::impl::GenericDict dict = target.toGenericDict();
    for (size_t i = 0; i < items.size(); i += 2) {
      grow(c.shape, adopt(items[i], target.internalToPointer()));
      grow(c.shape, adopt(items[i + 1], target.internalToPointer()));
      c10::IValue key = toIValue(items[i]);
      check(key.isString() || key.isInt() || key.isBool() || key.isDouble() || key.isTensor(), "a dict key that is a ",
            key.tagKind(), " (keys are strings, numbers or tensors)");
      dict.insert_or_assign(std::move(key), toIValue(items[i + 1]));
    }
  }
  void append(std::vector<Obj> items) {
    const c10::IValue& target = ivalue(top(), "a list to append to");
    if (!target.isList()) {
      check(target.isNone(), "items appended to a ", target.tagKind());
      return;
    }
    Container& c = growing(target);
    c10::List<c10::IValue> list = target.toList();
    for (const Obj& o : items) {
      grow(c.shape, adopt(o, target.internalToPointer()));
      list.push_back(toIValue(o));
    }
  }

  std::vector<int64_t> ints(const Obj& o, const char* what) {
    std::vector<int64_t> out;
    for (const Obj& e : tupleOf(o)->items) {
      const c10::IValue& v = ivalue(e, what);
      check(v.isInt(), what, " holds a ", v.tagKind());
      out.push_back(v.toInt());
    }
    return out;
  }

  // torch._utils._rebuild_tensor(_v2)(storage, offset, size, stride, ...): a view of the storage,
  // checked to lie inside it and to overlap nowhere (torch_unpickler.h).
  at::Tensor rebuildTensor(const std::vector<Obj>& args) {
    check(args.size() >= 4, "a tensor rebuilt from ", args.size(), " arguments");
    const c10::IValue& storage = ivalue(args[0], "a storage");
    check(storage.isTensor(), "a tensor rebuilt from a ", storage.tagKind(), ", not a storage");
    const c10::IValue& offset_v = ivalue(args[1], "an offset");
    check(offset_v.isInt(), "a tensor's offset is a ", offset_v.tagKind());
    const int64_t offset = offset_v.toInt();
    const std::vector<int64_t> size = ints(args[2], "a tensor's size"), stride = ints(args[3], "a tensor's stride");
    const at::Tensor& s = storage.toTensor();
    const std::string refusal = viewRefusal(size, stride, offset, s.numel());
    check(refusal.empty(), refusal);
    return s.as_strided(size, stride, std::min(offset, s.numel()));  // (a view of no element: any offset)
  }

  Obj call(const std::string& fn, const std::vector<Obj>& args, int depth = 0) {
    if (fn == "collections.OrderedDict" && args.empty()) {
      c10::IValue dict(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
      containers_[dict.internalToPointer()] = Container{};
      return Obj{std::move(dict)};
    }
    if (fn == "torch._utils._rebuild_tensor_v2" || fn == "torch._utils._rebuild_tensor") {
      return Obj{c10::IValue(rebuildTensor(args))};
    }
    if (fn == "torch._utils._rebuild_parameter" || fn == "torch._utils._rebuild_parameter_with_state") {
      check(!args.empty() && ivalue(args[0], "a parameter's data").isTensor(), "a parameter without its tensor");
      return args[0];
    }
    if (fn == "torch._utils._rebuild_from_type_v2") {  // (func, type, args, state)
      check(args.size() >= 3, "_rebuild_from_type_v2 with ", args.size(), " arguments");
      const auto* inner = std::get_if<Global>(&args[0].v);
      check(inner != nullptr, "_rebuild_from_type_v2 without a function");
      check(depth < kMaxDepth, "_rebuild_from_type_v2 nested more than ", kMaxDepth, " deep");
      return call(inner->name, tupleOf(args[2])->items, depth + 1);
    }
    return Obj{Opaque{fn}};
  }

  Obj persistentLoad(const std::vector<Obj>& pid) {
    check(pid.size() == 5, "a persistent id of ", pid.size(), " fields (torch.save writes 5)");
    const c10::IValue& tag = ivalue(pid[0], "'storage'");
    check(tag.isString() && tag.toStringRef() == "storage", "a persistent id that is not a storage");
    const auto* type = std::get_if<Global>(&pid[1].v);
    check(type != nullptr, "a storage without its type");
    const std::optional<at::ScalarType> dtype = storageDtype(type->name);
    check(dtype.has_value(), "storages of type ", type->name, " are not read");
    const c10::IValue& key = ivalue(pid[2], "a storage key");
    const c10::IValue& numel = ivalue(pid[4], "a storage size");
    check(key.isString() && numel.isInt() && numel.toInt() >= 0, "a storage id without key or size");
    check(key.toStringRef().size() <= 64 && std::all_of(key.toStringRef().begin(), key.toStringRef().end(),
                                                        [](char c) { return c > 0x20 && c < 0x7f; }),
          "a storage key that is not a short printable name");
    auto cached = storages_.find(key.toStringRef());
    if (cached == storages_.end()) {
      at::Tensor t = load_(key.toStringRef(), *dtype, numel.toInt());
      cached = storages_.emplace(key.toStringRef(), t).first;
    }
    check(cached->second.scalar_type() == *dtype, "storage ", key.toStringRef(), " read as two types");
    return Obj{c10::IValue(cached->second)};
  }

  void step(unsigned char op) {
    switch (op) {
      case 0x80:  // PROTO
        check(static_cast<unsigned char>(take(1)[0]) <= 5, "pickle protocol above 5");
        return;
      case 0x95:  // FRAME: a length hint
        take(8);
        return;
      case '(':  // MARK
        marks_.push_back(stack_.size());
        return;
      case '}':  // EMPTY_DICT
        return pushContainer(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
      case ']':  // EMPTY_LIST
        return pushContainer(c10::impl::GenericList(c10::AnyType::get()));
      case ')':  // EMPTY_TUPLE
        return pushTuple({});
      case 't':  // TUPLE
        return pushTuple(popToMark());
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        std::vector<Obj> items(op - 0x84);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        return pushTuple(std::move(items));
      }
      case 's': {  // SETITEM
        Obj value = pop(), key = pop();
        std::vector<Obj> kv;
        kv.push_back(std::move(key));
        kv.push_back(std::move(value));
        return setItems(std::move(kv));
      }
      case 'u':  // SETITEMS
        return setItems(popToMark());
      case 'a': {  // APPEND
        std::vector<Obj> one;
        one.push_back(pop());
        return append(std::move(one));
      }
      case 'e':  // APPENDS
        return append(popToMark());
      case 'X':  // BINUNICODE
        return push(std::string(take(unsignedLE(4))));
      case 0x8c:  // SHORT_BINUNICODE
        return push(std::string(take(unsignedLE(1))));
      case 0x8d:  // BINUNICODE8
        return push(std::string(take(unsignedLE(8))));
      case 'B':   // BINBYTES
      case 'C':   // SHORT_BINBYTES
      case 0x8e:  // BINBYTES8
        take(unsignedLE(op == 'C' ? 1 : op == 'B' ? 4 : 8));
        stack_.push_back(Obj{Opaque{"bytes"}});
        return;
      case 'J':  // BININT
        return push(signedLE(4));
      case 'K':  // BININT1
        return push(static_cast<int64_t>(unsignedLE(1)));
      case 'M':  // BININT2
        return push(static_cast<int64_t>(unsignedLE(2)));
      case 0x8a:  // LONG1
        return push(signedLE(unsignedLE(1)));
      case 0x8b:  // LONG4
        return push(signedLE(unsignedLE(4)));
      case 'G': {  // BINFLOAT: big-endian
        const std::string_view s = take(8);
        uint64_t bits = 0;
        for (char c : s) bits = (bits << 8) | static_cast<unsigned char>(c);
        double d;
        std::memcpy(&d, &bits, sizeof(d));
        return push(d);
      }
      case 'N':  // NONE
        return push(c10::IValue());
      case 0x88:  // NEWTRUE
        return push(true);
      case 0x89:  // NEWFALSE
        return push(false);
      case 'c': {  // GLOBAL
        const std::string module = line();
        stack_.push_back(global(module, line()));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const c10::IValue name = ivalue(pop(), "a global's name"), module = ivalue(pop(), "a global's module");
        check(name.isString() && module.isString(), "STACK_GLOBAL of non-strings");
        stack_.push_back(global(module.toStringRef(), name.toStringRef()));
        return;
      }
      case 'q':  // BINPUT
        memo_[unsignedLE(1)] = top();
        return;
      case 'r':  // LONG_BINPUT
        memo_[unsignedLE(4)] = top();
        return;
      case 0x94:  // MEMOIZE
        memo_[memo_.size()] = top();
        return;
      case 'h':    // BINGET
      case 'j': {  // LONG_BINGET
        const auto it = memo_.find(unsignedLE(op == 'h' ? 1 : 4));
        check(it != memo_.end(), "a memo entry that was never put");
        stack_.push_back(it->second);
        return;
      }
      case 'Q':  // BINPERSID
        stack_.push_back(persistentLoad(tupleOf(pop())->items));
        return;
      case 'R': {  // REDUCE
        const std::shared_ptr<Tuple> args = tupleOf(pop());
        const Obj fn = pop();
        const auto* g = std::get_if<Global>(&fn.v);
        stack_.push_back(g ? call(g->name, args->items) : Obj{Opaque{"a call's result"}});
        return;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        pop();
        const Obj cls = pop();
        const auto* g = std::get_if<Global>(&cls.v);
        stack_.push_back(g && g->name == "collections.OrderedDict" ? call(g->name, {})
                                                                   : Obj{Opaque{g ? g->name : "an object"}});
        return;
      }
      case 'b':  // BUILD: the object's state (an OrderedDict's _metadata, __dict__) is dropped
        pop();
        top();
        return;
      case '0':  // POP
        pop();
        return;
      case '1':  // POP_MARK
        popToMark();
        return;
      case '2':  // DUP
        stack_.push_back(top());
        return;
      default: fail("not one torch.save writes for tensors and plain values");
    }
  }

  std::string_view in_;
  const StorageLoader& load_;
  size_t pos_ = 0, op_at_ = 0;
  std::vector<Obj> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Obj> memo_;  // (ordered: its keys are the file's, which could crowd a hash bucket)
  std::map<std::string, at::Tensor> storages_;
  std::vector<std::string> opaque_types_;
  const uint64_t max_nodes_;
  std::unordered_map<const void*, Container> containers_;  // every list and dict made, by address
  std::unordered_map<const Tuple*, c10::IValue> tuples_;   // tuples converted (toIValue)
  std::vector<std::shared_ptr<Tuple>> keep_;               // their keys, alive
};

}  // namespace

Unpickled unpickleTorch(const std::string& bytes, const StorageLoader& load_storage) {
  AIACC_CHECK_INPUT(!bytes.empty(), "an empty pickle");
  try {
    return Machine(bytes, load_storage).run();
  } catch (const c10::Error& e) {  // e.g. a dict key LibTorch cannot hash
    AIACC_THROW(InputError, "a pickle value LibTorch cannot hold: ", firstLine(e.what_without_backtrace()));
  }
}

}  // namespace aiacc::models
