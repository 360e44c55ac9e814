#include "comm/nccl_transport.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <cstring>
#include <deque>
#include <mutex>

#include "comm/store.h"

namespace aiacc::comm {
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) AIACC_THROW(CommError, "NCCL ", what, " failed: ", ncclGetErrorString(r));
}

ncclDataType_t ncclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    default: AIACC_THROW(Error, "NCCL: unsupported dtype ", t);
  }
}

// Completion = the channel's event; waiting = the caller's stream waits for it (no host sync).
// `after` runs on the host once the event was waited for (staging back to host tensors).
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, ncclComm_t comm, std::function<void()> after)
      : done_(std::move(done)), comm_(comm), after_(std::move(after)) {}
  void wait() override {
    if (comm_) {
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &async), "async error query");
      if (async != ncclSuccess) AIACC_THROW(CommError, "NCCL collective failed: ", ncclGetErrorString(async));
    }
    done_->block(c10::cuda::getCurrentCUDAStream(done_->device_index()));
    if (after_) {
      auto f = std::move(after_);
      after_ = nullptr;
      f();
    }
  }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  ncclComm_t comm_;
  std::function<void()> after_;
};

}  // namespace

class NcclTransport::Channel {
 public:
  Channel(c10d::Store& store, const NcclOptions& o, int index)
      : device_(static_cast<c10::DeviceIndex>(o.device)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)) {
    c10::cuda::CUDAGuard guard(device_);
    const std::string key = strCat(o.name, "/nccl/c", index, "/id");
    ncclUniqueId id;
    if (o.rank == 0) {
      check(ncclGetUniqueId(&id), "get unique id");
      store.set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
    }
    store.wait({key}, o.timeout);
    const auto bytes = store.get(key);
    AIACC_CHECK(bytes.size() == sizeof(id), "NCCL unique id of the wrong size in the store");
    std::memcpy(&id, bytes.data(), sizeof(id));
    check(ncclCommInitRank(&comm_, o.world, id, o.rank), "communicator init");
  }
  ~Channel() {
    if (comm_) ncclCommDestroy(comm_);
  }

  ChannelStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!timing_.empty() && timing_.front().second->query()) {  // completed, in order
      stats_.busy_s += timing_.front().first->elapsed_time(*timing_.front().second) / 1e3;
      timing_.pop_front();
    }
    return stats_;
  }

  // Runs fn(comm, stream) on the channel stream, ordered after the caller's current stream's
  // work so far, with t's memory kept alive for the channel stream.
  std::shared_ptr<Work> run(const std::vector<at::Tensor>& tensors, size_t bytes,
                            const std::function<void(ncclComm_t, cudaStream_t)>& fn,
                            std::function<void()> after = nullptr) {
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_));
    ready.block(stream_);
    for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    auto start = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    auto done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    start->record(stream_);
    fn(comm_, stream_.stream());
    done->record(stream_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes += static_cast<double>(bytes);
      timing_.emplace_back(start, done);
    }
    return std::make_shared<NcclWork>(done, comm_, std::move(after));
  }

  c10::DeviceIndex device() const { return device_; }

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
  std::mutex mu_;
  ChannelStats stats_;
  std::deque<std::pair<std::shared_ptr<at::cuda::CUDAEvent>, std::shared_ptr<at::cuda::CUDAEvent>>> timing_;
};

NcclTransport::NcclTransport(c10::intrusive_ptr<c10d::Store> store, const NcclOptions& options) : opt_(options) {
  AIACC_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "rank ", opt_.rank, " of ", opt_.world);
  AIACC_CHECK_INPUT(opt_.channels >= 1 && opt_.channels <= 16, "channels must be 1..16");
  store->set(opt_.name + "/joined/" + std::to_string(opt_.rank), {1});
  waitForRanks(*store, opt_.name + "/joined", opt_.world, opt_.timeout);
  for (int c = 0; c < opt_.channels; ++c) channels_.push_back(std::make_unique<Channel>(*store, opt_, c));
}

NcclTransport::~NcclTransport() = default;

std::string NcclTransport::describe() const {
  return strCat("nccl, ", opt_.world, " ranks, ", channels(), channels() == 1 ? " channel" : " channels");
}

NcclTransport::Channel& NcclTransport::channel(int c) const {
  AIACC_CHECK(c >= 0 && c < channels(), "channel ", c, " of ", channels());
  return *channels_[static_cast<size_t>(c)];
}

ChannelStats NcclTransport::channelStats(int c) const { return channel(c).stats(); }

namespace {
// A host tensor travels through the device; the result is copied back when waited for.
struct Staged {
  at::Tensor device;
  std::function<void()> back;
};
Staged stage(const at::Tensor& t, c10::DeviceIndex device) {
  AIACC_CHECK(t.is_contiguous(), "NCCL needs contiguous tensors");
  if (t.is_cuda()) return {t, nullptr};
  at::Tensor d = t.to(at::Device(at::kCUDA, device));
  return {d, [t, d]() mutable {
            c10::cuda::getCurrentCUDAStream(d.device().index()).synchronize();
            t.copy_(d.cpu());
          }};
}
}  // namespace

std::shared_ptr<Work> NcclTransport::allreduce(at::Tensor t, ReduceOp op, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device;
  if (op == ReduceOp::kBitwiseOr) {  // no NCCL op: gather every rank's, fold locally
    at::Tensor all = at::empty({size(), d.numel()}, d.options());
    auto gathered = ch.run({d, all}, all.nbytes(), [&](ncclComm_t comm, cudaStream_t st) {
      check(ncclAllGather(d.data_ptr(), all.data_ptr(), d.nbytes(), ncclUint8, comm, st), "allgather");
    });
    gathered->wait();
    at::Tensor folded = all[0].clone();
    for (int r = 1; r < size(); ++r) folded.bitwise_or_(all[r]);
    d.view(-1).copy_(folded);
    if (s.back) s.back();
    return std::make_shared<NcclWork>(std::make_shared<at::cuda::CUDAEvent>(), nullptr, nullptr);
  }
  return ch.run({d}, d.nbytes(), [&](ncclComm_t comm, cudaStream_t st) {
    check(ncclAllReduce(d.data_ptr(), d.data_ptr(), static_cast<size_t>(d.numel()), ncclType(d.scalar_type()),
                        ncclSum, comm, st), "allreduce");
  }, s.back);
}

std::shared_ptr<Work> NcclTransport::broadcast(at::Tensor t, int root, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device;
  return ch.run({d}, d.nbytes(), [&](ncclComm_t comm, cudaStream_t st) {
    check(ncclBroadcast(d.data_ptr(), d.data_ptr(), d.nbytes(), ncclUint8, root, comm, st), "broadcast");
  }, s.back);
}

std::shared_ptr<Work> NcclTransport::allgather(at::Tensor in, at::Tensor out, int c) {
  Channel& ch = channel(c);
  AIACC_CHECK(out.nbytes() == in.nbytes() * static_cast<size_t>(size()), "allgather: out must hold ", size(), " x in");
  Staged si = stage(in, ch.device()), so = stage(out, ch.device());
  at::Tensor di = si.device, dout = so.device;
  return ch.run({di, dout}, dout.nbytes(), [&](ncclComm_t comm, cudaStream_t st) {
    check(ncclAllGather(di.data_ptr(), dout.data_ptr(), di.nbytes(), ncclUint8, comm, st), "allgather");
  }, so.back);
}

std::shared_ptr<Work> NcclTransport::reduceScatter(at::Tensor t, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device;
  const int P = size();
  const int64_t n = d.numel();
  const ncclDataType_t type = ncclType(d.scalar_type());
  const size_t es = d.element_size();
  return ch.run({d}, d.nbytes(), [&](ncclComm_t comm, cudaStream_t st) {
    char* base = static_cast<char*>(d.data_ptr());
    if (n % P == 0) {  // in place: rank r's output is shard r of the input
      const size_t count = static_cast<size_t>(n / P);
      check(ncclReduceScatter(base, base + rank() * count * es, count, type, ncclSum, comm, st), "reduce-scatter");
      return;
    }
    check(ncclGroupStart(), "group start");
    for (int q = 0; q < P; ++q) {
      const Shard sh = shardOf(n, P, q);
      char* p = base + sh.offset * es;
      check(ncclReduce(p, p, static_cast<size_t>(sh.count), type, ncclSum, q, comm, st), "reduce");
    }
    check(ncclGroupEnd(), "group end");
  }, s.back);
}

std::shared_ptr<Work> NcclTransport::allgatherShards(at::Tensor t, int c) {
  Channel& ch = channel(c);
  Staged s = stage(t, ch.device());
  at::Tensor d = s.device;
  const int P = size();
  const int64_t n = d.numel();
  const size_t es = d.element_size();
  return ch.run({d}, d.nbytes(), [&](ncclComm_t comm, cudaStream_t st) {
    char* base = static_cast<char*>(d.data_ptr());
    if (n % P == 0) {
      const size_t bytes = static_cast<size_t>(n / P) * es;
      check(ncclAllGather(base + rank() * bytes, base, bytes, ncclUint8, comm, st), "allgather");
      return;
    }
    check(ncclGroupStart(), "group start");
    for (int q = 0; q < P; ++q) {
      const Shard sh = shardOf(n, P, q);
      char* p = base + sh.offset * es;
      check(ncclBroadcast(p, p, static_cast<size_t>(sh.count) * es, ncclUint8, q, comm, st), "broadcast");
    }
    check(ncclGroupEnd(), "group end");
  }, s.back);
}

}  // namespace aiacc::comm
