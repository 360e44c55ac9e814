// aiacc_bench: benchmarks users can run on their own machine and data. This file is the
// dispatcher: the usage, every flag (defined here once, parsed once into each benchmark's typed
// options), the mode choice; the benchmarks are in app/bench/ (app/bench/bench.h).
//
//   aiacc_bench data --data DIR --image-size S --workers T [--images N] [--batch-size B]
//     decode + random-resized-crop + flip + normalize throughput of the training input pipeline
//     over DIR/train (or DIR itself when it has class folders), in images/s total and per
//     worker thread. scripts/bench_data.sh runs it beside torchvision on the same files.
//   aiacc_bench allreduce: aiacc's allreduce modes against Gloo's own ring allreduce.
//   aiacc_bench negotiation: what agreeing on gradient readiness costs per step.
#include <gflags/gflags.h>

#include <iostream>
#include <string>
#include <vector>

#include "app/bench/bench.h"
#include "app/cli.h"
#include "aiacc/common/error.h"

DEFINE_string(data, "", "folder of JPEGs in ImageNet layout (DIR/train/<class>/* or DIR/<class>/*)");
DEFINE_int32(image_size, 224, "output image size");
DEFINE_int32(workers, 1, "decode threads");
DEFINE_int32(batch_size, 64, "images per batch");
DEFINE_int64(images, 0, "stop after about this many images; 0: one pass over the folder");
DEFINE_double(min_scale, 0.08, "random-resized-crop minimum area fraction");
DEFINE_int32(repeat, 1, "passes over the folder (page cache warm after the first)");
DEFINE_int32(jpeg_index_mb, 1024,
             "data: memory for JPEG entropy indexes (aiacc_train's flag of the same "
             "name), built along each file's first decode; later passes then decode only each crop's MCUs. "
             "The first pass and the later ones are reported apart. 0: off");
DEFINE_bool(breakdown, false,
            "data: time each stage of the training transform on one thread, per image: "
            "file read, Huffman decoding down to the crop's last row (the floor under the decode), the "
            "crop's whole decode, resize+mirror+normalize; then the crop's decode with a JPEG index, and "
            "the index's build");
DEFINE_bool(entropy_only, false,
            "data: only entropy-decode each whole file on one thread (no IDCT, "
            "colour, crop or resize): the floor under the full pipeline's time per image");
DEFINE_bool(libjpeg_huffman, false,
            "data: entropy-decode with libjpeg-turbo's own Huffman decoder instead of "
            "aiacc's (data/entropy_hook.h), for comparison; the pixels are the same");
DEFINE_string(resize, "torchvision",
              "data: how a crop becomes the output (aiacc_train's flag of the same name): "
              "torchvision (full-resolution decode, Pillow's antialiased bilinear: torchvision's pictures) | dct "
              "(DCT-scaled decode, Pillow's filter) | fast (DCT-scaled decode, OpenCV's bilinear/area)");
DEFINE_bool(bytes, false,
            "data: uint8 batches, as the GPU input path makes them (normalized on the "
            "device afterwards), instead of normalized floats");
DEFINE_int32(nproc, 2, "allreduce: ranks (processes) on this machine");
DEFINE_int32(streams, 2, "allreduce: channels the aiacc mode splits each buffer across");
DEFINE_double(max_mb, 256, "allreduce: largest buffer, MiB");
DEFINE_string(master, "127.0.0.1:29591", "allreduce: host:port of the rendezvous store");
DEFINE_int32(max_nproc, 16, "negotiation: largest number of local processes (2, 4, ... up to it)");
DEFINE_int32(steps, 50, "negotiation: timed steps per mode");
DEFINE_int32(nnodes, 1, "allreduce: nodes in the job (run aiacc_bench on each with its --node-rank)");
DEFINE_int32(node_rank, 0, "allreduce: this node's index");
DEFINE_string(allreduce_dtype, "both", "allreduce: aiacc modes to time: fp32 | fp16 | both");
DEFINE_string(hierarchical, "off",
              "allreduce: on adds two-level modes (reduce-scatter in the node, "
              "allreduce between nodes, allgather in the node)");
DEFINE_int32(ranks_per_node, 0, "allreduce: ranks per node for two-level modes; 0: the launcher's local size");
DEFINE_bool(shm, true,
            "allreduce: add shared-memory modes when every rank is on this host (and "
            "use shared memory inside the node in two-level modes)");
DEFINE_string(bind_host, "",
              "allreduce: address this rank's Gloo transport listens on; default: "
              "the local address that routes to the --master host");

namespace {

aiacc::app::DataBenchOptions dataOptionsFromFlags() {
  aiacc::app::DataBenchOptions o;
  o.data = FLAGS_data;
  o.image_size = FLAGS_image_size;
  o.workers = FLAGS_workers;
  o.batch_size = FLAGS_batch_size;
  o.images = FLAGS_images;
  o.min_scale = FLAGS_min_scale;
  o.repeat = FLAGS_repeat;
  o.jpeg_index_mb = FLAGS_jpeg_index_mb;
  o.breakdown = FLAGS_breakdown;
  o.entropy_only = FLAGS_entropy_only;
  o.libjpeg_huffman = FLAGS_libjpeg_huffman;
  o.resize = FLAGS_resize;
  o.bytes = FLAGS_bytes;
  return o;
}

aiacc::app::AllreduceBenchOptions allreduceOptionsFromFlags() {
  aiacc::app::AllreduceBenchOptions o;
  o.nproc = FLAGS_nproc;
  o.streams = FLAGS_streams;
  o.max_mb = FLAGS_max_mb;
  o.master = FLAGS_master;
  o.nnodes = FLAGS_nnodes;
  o.node_rank = FLAGS_node_rank;
  o.allreduce_dtype = FLAGS_allreduce_dtype;
  o.hierarchical = FLAGS_hierarchical;
  o.ranks_per_node = FLAGS_ranks_per_node;
  o.shm = FLAGS_shm;
  o.bind_host = FLAGS_bind_host;
  return o;
}

aiacc::app::NegotiationBenchOptions negotiationOptionsFromFlags() {
  aiacc::app::NegotiationBenchOptions o;
  o.max_nproc = FLAGS_max_nproc;
  o.steps = FLAGS_steps;
  o.master = FLAGS_master;
  o.bind_host = FLAGS_bind_host;
  return o;
}

}  // namespace

const char kUsage[] =
    "usage: aiacc_bench data --data DIR [--image-size S] [--workers T] [--images N] [--bytes | --entropy-only]\n"
    "       aiacc_bench allreduce [--nproc N] [--streams K] [--allreduce-dtype fp32|fp16|both]\n"
    "                 [--hierarchical on --ranks-per-node R] [--max-mb M] [--master host:port]\n"
    "       aiacc_bench negotiation [--max-nproc 16] [--steps 50]\n";

int main(int argc, char** argv) {
  aiacc::app::setUpProcess();  // before any thread starts
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "-help") {
      std::cout << kUsage
                << "\nBenchmarks printed as ratios against a baseline measured in the same "
                   "run. Flags (hyphens or underscores):\n";
      aiacc::app::printFlagsFrom({"app/bench_main.cc"}, std::cout);
      return 0;
    }
  }
  const std::vector<std::string> rest =
      aiacc::app::parseCommandLine(argc, argv, "aiacc_bench data --data DIR --image-size S --workers T");
  const std::string mode = rest.size() >= 2 ? rest[1] : "";
  if (mode != "data" && mode != "allreduce" && mode != "negotiation") {
    std::cerr << kUsage << "(see --help)\n";
    return 2;
  }
  const std::vector<std::string> args(argv, argv + argc);  // the workers' command line
  try {
    if (mode == "negotiation") return aiacc::app::benchNegotiation(negotiationOptionsFromFlags(), args);
    if (mode == "allreduce") return aiacc::app::benchAllreduce(allreduceOptionsFromFlags(), args);
    return aiacc::app::benchData(dataOptionsFromFlags());
  } catch (const aiacc::Error& e) {
    std::cerr << "aiacc_bench: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // LibTorch's or the standard library's: one line too
    std::cerr << "aiacc_bench: internal error: " << aiacc::firstLine(e.what()) << "\n";
    return 1;
  }
}
