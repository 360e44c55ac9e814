#include "aiacc/comm/factory.h"
#include "aiacc/config.h"

#include "aiacc/comm/gloo_transport.h"
#include "aiacc/comm/hierarchical.h"
#include "aiacc/comm/shm_transport.h"
#if AIACC_WITH_NCCL
#include "aiacc/comm/nccl_transport.h"
#endif

namespace aiacc::comm {
namespace {

#if !AIACC_WITH_GLOO
constexpr const char* kNoGloo =
    "built against a LibTorch that carries its own Gloo without headers, e.g. a pip wheel; see README, Gloo";
#endif

#if AIACC_WITH_NCCL
std::shared_ptr<Transport> nccl(c10::intrusive_ptr<c10d::Store> store, const std::string& name, int rank, int world,
                                int channels, const TransportSpec& spec) {
  NcclOptions o;
  o.rank = rank;
  o.world = world;
  o.channels = channels;
  o.device = spec.device >= 0 ? spec.device : spec.world.local_rank;
  o.timeout = spec.timeout;
  o.name = name;
  o.log = spec.log;
  return std::make_shared<NcclTransport>(store, o);
}
#endif

std::shared_ptr<Transport> twoLevel(c10::intrusive_ptr<c10d::Store> store, const GlooOptions& go,
                                    const TransportSpec& spec) {
  const int R = ranksPerNode(spec);
  AIACC_CHECK_INPUT(R >= 1 && spec.world.world % R == 0,
                    "two-level reduction needs the same number of ranks on "
                    "every node: world ",
                    spec.world.world, " is not a multiple of ", R, " ranks per node");
  if (spec.gpu) {
#if AIACC_WITH_NCCL
    const int node = spec.world.rank / R, local = spec.world.rank % R;
    auto intra = nccl(store, go.name + "/node" + std::to_string(node), local, R, 2 * spec.channels, spec);
    auto inter = nccl(store, go.name + "/local" + std::to_string(local), node, spec.world.world / R, spec.channels,
                      spec);
    return std::make_shared<HierarchicalTransport>(intra, inter);
#endif
  }
#if AIACC_WITH_GLOO
  return makeGlooHierarchical(store, go, R, 4096, spec.shm);
#else
  (void)store;
  (void)go;
  AIACC_THROW(Error, "internal: two-level CPU reduction without Gloo (checkLayoutSupported refuses it)");
#endif
}

}  // namespace

int ranksPerNode(const TransportSpec& spec) {
  return spec.ranks_per_node > 0 ? spec.ranks_per_node : spec.world.local_size;
}

bool useTwoLevel(const TransportSpec& spec) {
  const int R = ranksPerNode(spec), W = spec.world.world;
  if (spec.hierarchical == TwoLevelMode::kOff || R < 1) return false;
  if (spec.hierarchical == TwoLevelMode::kOn) return true;
  return R > 1 && W > R && W % R == 0;
}

void checkLayoutSupported(const TransportSpec& spec) {
#if !AIACC_WITH_NCCL
  AIACC_CHECK_INPUT(!spec.gpu, "GPU ranks need a build with CUDA LibTorch and NCCL");
#endif
#if !AIACC_WITH_GLOO
  if (spec.gpu) return;
  const WorldInfo& w = spec.world;
  const bool one_host = w.local_size == w.world && spec.ranks_per_node == 0;
  if (useTwoLevel(spec)) {
    AIACC_THROW(InputError,
                "two-level reduction between CPU nodes needs GlooTransport, which this build does "
                "not have (",
                kNoGloo, ")");
  }
  AIACC_CHECK_INPUT(spec.shm && one_host, "CPU ranks ",
                    one_host ? "with shared memory off or emulated nodes" : "on several hosts",
                    " need GlooTransport, which this build does not have (", kNoGloo,
                    "): run CPU ranks on one host (shared memory) or train on GPUs (NCCL)");
#endif
}

Transports makeTransports(c10::intrusive_ptr<c10d::Store> store, const TransportSpec& spec) {
  checkLayoutSupported(spec);
  const WorldInfo& w = spec.world;
  GlooOptions go;
  go.rank = w.rank;
  go.world = w.world;
  go.channels = spec.channels;
  go.timeout = spec.timeout;
  go.bind_host = spec.bind_host;
  go.timeline = spec.timeline;
  const bool two = useTwoLevel(spec);
  const bool tuned = two && spec.tune_two_level;
  Transports out;
  if (two && !tuned) {
    out.primary = twoLevel(store, go, spec);
    out.why = strCat("two-level: ", w.world / ranksPerNode(spec), " nodes x ", ranksPerNode(spec), " ranks");
    return out;
  }
  // One host, no emulated nodes: every rank can map every other's memory.
  const bool one_host = w.local_size == w.world && spec.ranks_per_node == 0;
  if (spec.gpu) {
#if AIACC_WITH_NCCL
    out.primary = nccl(store, "nccl", w.rank, w.world, spec.channels, spec);
    out.why = "NCCL between GPUs";
#endif
  } else if (spec.shm && one_host) {
    ShmOptions so;
    so.rank = w.rank;
    so.world = w.world;
    so.channels = spec.channels;
    so.timeout = spec.timeout;
    so.timeline = spec.timeline;
    out.primary = std::make_shared<ShmTransport>(store, so);
    out.why = "shared memory: every rank on this host";
  } else {
#if AIACC_WITH_GLOO
    out.primary = std::make_shared<GlooTransport>(store, go);
    out.why = one_host ? "Gloo over TCP (shared memory off or emulated nodes)" : "Gloo over TCP between hosts";
#else
    AIACC_THROW(Error, "internal: CPU ranks over TCP without Gloo (checkLayoutSupported refuses it)");
#endif
  }
  if (tuned) {
    GlooOptions g2 = go;
    g2.name = "gloo2";
    g2.row_base = spec.channels;
    out.alternative = twoLevel(store, g2, spec);
    out.why += "; two-level as the tuner's alternative";
  }
  return out;
}

}  // namespace aiacc::comm
