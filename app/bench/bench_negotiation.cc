// aiacc_bench negotiation: what agreeing on gradient readiness costs per step, decentralized and
// central, against no agreement, for 2, 4, ... --max-nproc local processes.
#include "aiacc/config.h"
#include "app/bench/bench.h"

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/bench/central_sync.h"
#include "app/launcher.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"

namespace aiacc::app {

#if AIACC_WITH_GLOO
namespace {

// One rank of the negotiation benchmark: a model too small to compute or transfer anything of
// note (30 tiny layers, one never used, so readiness must be agreed), trained for --steps steps
// three ways. The per-step time above the first is what agreeing costs.
int benchNegotiationWorker(const NegotiationBenchOptions& opts, const comm::WorldInfo& w) {
  using namespace comm;
  const auto [host, port] = parseHostPort(opts.master);
  StoreOptions so;
  so.host = host;
  so.port = port;
  so.rank = w.rank;
  so.world = w.world;
  auto store = makeTcpStore(so);
  GlooOptions go;
  go.rank = w.rank;
  go.world = w.world;
  go.bind_host = opts.bind_host.empty() ? localAddressToward(host) : opts.bind_host;
  auto transport = std::make_shared<GlooTransport>(store, go);
  at::set_num_threads(1);
  auto run = [&](bool detect_unused, bool central) {
    torch::nn::Sequential net;
    for (int i = 0; i < 30; ++i) net->push_back(torch::nn::Linear(8, 8));
    auto unused = torch::nn::Linear(8, 8);
    net->register_module("unused", unused);
    DataParallelOptions o;
    o.reducer.detect_unused = detect_unused;
    std::unique_ptr<GradientSync> sync;
    if (central) {
      sync = std::make_unique<CentralSync>(net.ptr(), transport, w);
    } else {
      sync = std::make_unique<DataParallel>(net.ptr(), transport, w, o);
    }
    const at::Tensor x = at::ones({2, 8});
    double total = 0;
    for (int s = 0; s < opts.steps + 3; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
      net->forward(x).sum().backward();
      sync->finishBackward();
      if (s >= 3) total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    at::Tensor t = at::tensor({total / opts.steps}, at::kDouble);
    transport->allreduce(t, ReduceOp::kSum, 0)->wait();  // mean over ranks
    return t.item<double>() / w.world * 1e3;
  };
  const double base = run(false, false);
  const double dec = run(true, false);
  const double cen = run(true, true);
  if (w.rank == 0) {
    std::printf("%6d %14.2f %16.2f %12.2f %18.2f %14.2f\n", w.world, base, dec, cen, dec - base, cen - base);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int benchNegotiation(const NegotiationBenchOptions& opts, const std::vector<std::string>& args) {
  if (auto w = worldFromEnvironment()) return benchNegotiationWorker(opts, *w);
  std::printf("negotiation overhead, ms per step (mean over ranks, %d steps, tiny model with one unused "
              "layer so readiness must be agreed)\n%6s %14s %16s %12s %18s %14s\n",
              opts.steps, "ranks", "no agreement", "decentralized", "central", "decentralized +", "central +");
  std::fflush(stdout);
  for (int n = 2; n <= opts.max_nproc; n *= 2) {
    LaunchSpec spec;
    spec.nproc = n;
    spec.master = opts.master;
    const int rc = launchWorkers(spec, args);
    if (rc != 0) return rc;
  }
  return 0;
}
#else
int benchNegotiation(const NegotiationBenchOptions&, const std::vector<std::string>&) {
  return refuseWithoutGloo("negotiation");
}
#endif

}  // namespace aiacc::app
