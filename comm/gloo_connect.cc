#include "aiacc/comm/gloo_connect.h"

#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdint>
#include <vector>

#include "aiacc/comm/transport.h"

namespace aiacc::comm {
namespace {

// Gloo's rendezvous talks to a gloo::rendezvous::Store; this adapts a c10d store to it, under a
// key prefix.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    const auto v = store_->get(prefix_ + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    try {
      store_->wait(full, timeout);
    } catch (const std::exception& e) {
      AIACC_THROW(CommError, "timed out after ", timeout.count() / 1000.0, " s waiting for peers to connect (", prefix_,
                  keys.front(), "): a rank did not start or died");
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// A slot no collective uses (theirs count up from 0): the interrupt's receive.
constexpr uint64_t kInterruptSlot = ~uint64_t{0};

}  // namespace

std::shared_ptr<gloo::rendezvous::Context> connectGloo(c10::intrusive_ptr<c10d::Store> store, const std::string& prefix,
                                                       int rank, int world, const std::string& bind_host,
                                                       std::chrono::milliseconds timeout, const std::string& label) {
  gloo::transport::tcp::attr attr;
  attr.hostname = bind_host;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(timeout);
  GlooStoreAdapter adapter(std::move(store), prefix, timeout);
  try {
    context->connectFullMesh(adapter, device);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    AIACC_THROW(CommError, label, ": connecting to peers failed: ", firstLine(e.what()));
  }
  return context;
}

void interruptGloo(gloo::Context& context) {
  if (context.size == 1) return;
  char byte = 0;
  auto buf = context.createUnboundBuffer(&byte, 1);
  for (int i = 1; i < context.size; ++i) {  // a peer whose pair still works
    try {
      buf->recv((context.rank + i) % context.size, kInterruptSlot);
    } catch (const std::exception&) {  // this pair failed already (and signalled its operations)
      continue;
    }
    try {
      buf->waitRecv(std::chrono::milliseconds(1));
    } catch (const std::exception&) {  // the timeout, as intended
    }
    return;
  }
}

}  // namespace aiacc::comm
