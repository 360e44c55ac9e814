// aiacc_bench allreduce: aiacc's allreduce modes (K channels, fp16 on the wire, shared memory,
// two-level) against Gloo's own ring allreduce on one context, measured in the same run.
#include "aiacc/config.h"
#include "app/bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/launcher.h"
#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/half.h"
#include "aiacc/comm/hierarchical.h"
#include "aiacc/comm/shm_transport.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"

namespace aiacc::app {

#if AIACC_WITH_GLOO
namespace {

// One rank of the allreduce benchmark: for each size, Gloo's own ring allreduce on one context
// (the baseline), then each aiacc mode on the same buffer. Every figure is fp32 payload: an
// fp16 mode moves half the bytes but delivers the same fp32 result, and is credited for that.
int benchAllreduceWorker(const AllreduceBenchOptions& opts, const comm::WorldInfo& w) {
  using comm::ReduceOp;
  using comm::Transport;
  using comm::Work;
  const auto [host, port] = parseHostPort(opts.master);
  comm::StoreOptions so;
  so.host = host;
  so.port = port;
  so.rank = w.rank;
  so.world = w.world;
  auto store = comm::makeTcpStore(so);
  const int K = opts.streams;
  comm::GlooOptions go;
  go.rank = w.rank;
  go.world = w.world;
  go.channels = K;
  go.bind_host = opts.bind_host.empty() ? localAddressToward(host) : opts.bind_host;
  auto flat = std::make_shared<comm::GlooTransport>(store, go);
  const int per_node = opts.ranks_per_node > 0 ? opts.ranks_per_node : w.local_size;
  std::shared_ptr<Transport> two_level;
  if (opts.hierarchical == "on") {
    go.name = "two-level";
    two_level = comm::makeGlooHierarchical(store, go, per_node, 4096, opts.shm);
  }
  std::shared_ptr<Transport> shm;
  if (opts.shm && w.local_size == w.world) {
    comm::ShmOptions so;
    so.rank = w.rank;
    so.world = w.world;
    so.channels = K;
    shm = std::make_shared<comm::ShmTransport>(store, so);
  }
  auto barrier = [&] {
    at::Tensor z = at::zeros({1}, at::kFloat);
    flat->allreduce(z, ReduceOp::kSum, 0)->wait();
  };
  // Equal shares over the K channels (identical channels on one machine; DataParallel weighs
  // them by measured speed).
  auto split = [K](Transport& t, at::Tensor buf) {
    std::vector<std::shared_ptr<Work>> works;
    const int64_t n = buf.numel();
    for (int c = 0; c < K; ++c) {
      const comm::Shard s = comm::shardOf(n, K, c);
      if (s.count > 0) works.push_back(t.allreduce(buf.narrow(0, s.offset, s.count), ReduceOp::kSum, c));
    }
    for (auto& wk : works) wk->wait();
  };
  // fp16 on the wire: scaled cast, reduce, cast back and unscale, as DataParallel does.
  at::Tensor wire;
  auto fp16 = [&, W = w.world](Transport& t, at::Tensor& buf) {
    if (wire.numel() != buf.numel()) wire = at::empty({buf.numel()}, at::kHalf);
    auto* h = reinterpret_cast<uint16_t*>(wire.data_ptr<at::Half>());
    comm::floatToHalf(buf.data_ptr<float>(), h, static_cast<size_t>(buf.numel()), 1.0f / W);
    split(t, wire);
    comm::halfToFloat(h, buf.data_ptr<float>(), static_cast<size_t>(buf.numel()), 1.0f);
  };
  struct Mode {
    std::string name;
    std::function<void(at::Tensor&)> op;
  };
  std::vector<Mode> modes;
  const std::string ks = std::to_string(K);
  const bool want32 = opts.allreduce_dtype != "fp16", want16 = opts.allreduce_dtype != "fp32";
  if (want32) modes.push_back({"fp32 x" + ks, [&](at::Tensor& b) { split(*flat, b); }});
  if (want16) modes.push_back({"fp16 x" + ks, [&](at::Tensor& b) { fp16(*flat, b); }});
  if (shm && want32) modes.push_back({"shm fp32 x" + ks, [&](at::Tensor& b) { split(*shm, b); }});
  if (shm && want16) modes.push_back({"shm fp16 x" + ks, [&](at::Tensor& b) { fp16(*shm, b); }});
  if (two_level && want32) modes.push_back({"2lvl fp32 x" + ks, [&](at::Tensor& b) { split(*two_level, b); }});
  if (two_level && want16) modes.push_back({"2lvl fp16 x" + ks, [&](at::Tensor& b) { fp16(*two_level, b); }});
  auto timeIt = [&](const std::function<void(at::Tensor&)>& op, at::Tensor& buf, int iters) {
    op(buf);  // warm-up
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op(buf);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  const double bus = 2.0 * (w.world - 1) / w.world;
  if (w.rank == 0) {
    std::printf("allreduce, %d ranks%s; busbw = fp32 payload bytes x 2(n-1)/n / time, GB/s; baseline: "
                "Gloo ring allreduce on one context\n",
                w.world, two_level ? (", two-level with " + std::to_string(per_node) + " ranks per node").c_str() : "");
    std::printf("%10s %10s %9s", "bytes", "gloo us", "busbw");
    for (const auto& m : modes) std::printf(" | %-13s %9s %6s", m.name.c_str(), "busbw", "ratio");
    std::printf("\n");
  }
  std::vector<double> last_ratio(modes.size(), 0), last_busbw(modes.size(), 0);
  for (int64_t bytes = 4096; bytes <= static_cast<int64_t>(opts.max_mb * (1 << 20)); bytes *= 4) {
    at::Tensor buf = at::ones({bytes / 4}, at::kFloat);
    const int iters = static_cast<int>(std::clamp<int64_t>((64ll << 20) / bytes, 3, 50));
    const double tb = timeIt([&](at::Tensor& b) { flat->allreduce(b, ReduceOp::kSum, 0)->wait(); }, buf, iters);
    const double gb = static_cast<double>(bytes) / 1e9;
    if (w.rank == 0) std::printf("%10lld %10.1f %9.3f", static_cast<long long>(bytes), tb * 1e6, gb / tb * bus);
    for (size_t m = 0; m < modes.size(); ++m) {
      const double ta = timeIt(modes[m].op, buf, iters);
      last_ratio[m] = tb / ta;
      last_busbw[m] = gb / ta * bus;
      if (w.rank == 0) std::printf(" | %-13s %9.3f %5.2fx", "", gb / ta * bus, tb / ta);
    }
    if (w.rank == 0) std::printf("\n");
  }
  if (w.rank == 0) {
    std::printf("headline at the largest size, vs Gloo's single context:");
    for (size_t m = 0; m < modes.size(); ++m) {
      std::printf(" %s %.2fx (%.2f GB/s)%s", modes[m].name.c_str(), last_ratio[m], last_busbw[m],
                  m + 1 < modes.size() ? ";" : "\n");
    }
  }
  barrier();
  return 0;
}

}  // namespace

int benchAllreduce(const AllreduceBenchOptions& opts, const std::vector<std::string>& args) {
  if (auto w = worldFromEnvironment()) return benchAllreduceWorker(opts, *w);
  LaunchSpec spec;
  spec.nproc = opts.nproc;
  spec.master = opts.master;
  spec.nnodes = opts.nnodes;
  spec.node_rank = opts.node_rank;
  return launchWorkers(spec, args);
}
#else
int benchAllreduce(const AllreduceBenchOptions&, const std::vector<std::string>&) {
  return refuseWithoutGloo("allreduce");
}
#endif

}  // namespace aiacc::app
