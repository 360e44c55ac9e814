// aiacc_bench's benchmarks, one per file behind the dispatcher app/bench_main.cc, which defines
// every flag (gflags), parses them once and hands each benchmark its options as a typed struct
// (the defaults and each flag's why are in bench_main.cc):
//   data         app/bench/bench_data.cc         the training input pipeline's throughput
//   allreduce    app/bench/bench_allreduce.cc    aiacc's allreduce modes against Gloo's own ring
//   negotiation  app/bench/bench_negotiation.cc  what agreeing on readiness costs per step
// Each entry point returns the process exit code and throws aiacc::Error on bad input or failure.
// The allreduce and negotiation entries launch their worker processes (app/launcher.h) with
// `args`, the command line as given, and run one rank when started as a worker; a build without
// Gloo refuses both (exit code 2, one line saying why).
//
// May call: aiacc_data, aiacc_comm, app/launcher.h; nothing else from app/ (no flags: FLAGS_*
// live in bench_main.cc only).
#pragma once

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace aiacc::app {

struct DataBenchOptions {
  std::string data;  // DIR/train/<class>/* or DIR/<class>/*
  int image_size = 0;
  int workers = 0;
  int batch_size = 0;
  int64_t images = 0;  // 0: one pass per --repeat
  double min_scale = 0;
  int repeat = 0;
  int jpeg_index_mb = 0;
  bool breakdown = false;
  bool entropy_only = false;
  bool libjpeg_huffman = false;
  std::string resize;  // torchvision | dct | fast
  bool bytes = false;
};

struct AllreduceBenchOptions {
  int nproc = 0;
  int streams = 0;
  double max_mb = 0;
  std::string master;  // host:port
  int nnodes = 0;
  int node_rank = 0;
  std::string allreduce_dtype;  // fp32 | fp16 | both
  std::string hierarchical;     // on | off
  int ranks_per_node = 0;       // 0: the launcher's local size
  bool shm = false;
  std::string bind_host;  // empty: the local address toward the master
};

struct NegotiationBenchOptions {
  int max_nproc = 0;
  int steps = 0;
  std::string master;     // host:port
  std::string bind_host;  // empty: the local address toward the master
};

int benchData(const DataBenchOptions& o);
int benchAllreduce(const AllreduceBenchOptions& o, const std::vector<std::string>& args);
int benchNegotiation(const NegotiationBenchOptions& o, const std::vector<std::string>& args);

// What the allreduce and negotiation benchmarks say in a build without GlooTransport.
inline int refuseWithoutGloo(const std::string& mode) {
  std::cerr << "aiacc_bench: error: '" << mode
            << "' measures GlooTransport, which this build does not have "
               "(built against a LibTorch carrying its own Gloo without headers; see README, Gloo)\n";
  return 2;
}

}  // namespace aiacc::app
