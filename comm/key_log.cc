#include "aiacc/comm/key_log.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <sstream>

#include "aiacc/common/torch_compat.h"

namespace aiacc::comm {
namespace {

class RecordingPrefixStore : public c10d::PrefixStore {
 public:
  RecordingPrefixStore(const std::string& prefix, c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<KeyLog> log)
      : c10d::PrefixStore(prefix, std::move(store)), log_(std::move(log)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    log_->add(key);
    c10d::PrefixStore::set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    log_->add(key);
    return c10d::PrefixStore::compareSet(key, expected, desired);
  }
  int64_t add(const std::string& key, int64_t value) override {
    log_->add(key);
    return c10d::PrefixStore::add(key, value);
  }
#ifdef AIACC_TORCH_STORE_HAS_APPEND
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    log_->add(key);
    c10d::PrefixStore::append(key, value);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    for (const std::string& k : keys) log_->add(k);
    c10d::PrefixStore::multiSet(keys, values);
  }
#endif

 private:
  std::shared_ptr<KeyLog> log_;
};

}  // namespace

void KeyLog::add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (seen_.insert(key).second) keys_.push_back(key);
}

std::vector<std::string> KeyLog::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_;
}

void KeyLog::publish(c10d::Store& store, const std::string& list_key) const {
  std::string text;
  for (const std::string& k : keys()) text += k + "\n";
  store.set(list_key, std::vector<uint8_t>(text.begin(), text.end()));
}

int64_t KeyLog::deleteOwn(c10d::Store& store, const std::string& list_key) const {
  int64_t n = 0;
  for (const std::string& k : keys()) n += store.deleteKey(k) ? 1 : 0;
  store.deleteKey(list_key);
  return n;
}

int64_t KeyLog::deleteKeysOf(c10d::Store& store, const std::string& list_key) {
  if (!store.check({list_key})) return 0;
  const std::vector<uint8_t> bytes = store.get(list_key);
  std::istringstream lines(std::string(bytes.begin(), bytes.end()));
  int64_t n = 0;
  for (std::string k; std::getline(lines, k);) {
    if (!k.empty()) n += store.deleteKey(k) ? 1 : 0;
  }
  store.deleteKey(list_key);
  return n;
}

c10::intrusive_ptr<c10d::Store> makeRecordingPrefixStore(const std::string& prefix,
                                                         c10::intrusive_ptr<c10d::Store> store,
                                                         std::shared_ptr<KeyLog> log) {
  return c10::make_intrusive<RecordingPrefixStore>(prefix, std::move(store), std::move(log));
}

}  // namespace aiacc::comm
