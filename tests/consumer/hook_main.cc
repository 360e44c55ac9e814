// The example's program with its comm hook (examples/ddp_minimal/fp16_compress.h) and the
// explicit form of the step: DataParallel over a transport and a world, the options built by the
// program, and finishBackward() after backward (finish_in_backward off). tests/install_test.sh runs
// it on 2 processes with DDP_MINIMAL_FP16 set (fp16 on the wire through the hook) and without.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <string>

#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/process_group.h"
#include "fp16_compress.h"

int main(int argc, char** argv) {
  auto group = aiacc::comm::initProcessGroup();  // torchrun's (or Slurm's, MPI's, ...) variables
  const int rank = group.world.rank, world = group.world.world;
  torch::manual_seed(0);  // the same batch and initial weights in every process
  auto x = torch::randn({64, 8});
  auto y = torch::sin(x.matmul(torch::linspace(-1, 1, 8)).unsqueeze(1));
  x = x.chunk(world)[rank], y = y.chunk(world)[rank];  // this rank's share (world divides 64)
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1));
  auto options = aiacc::comm::optionsFromEnvironment();  // AIACC_BUCKET_MB, ... (docs/comm.md)
  options.finish_in_backward = false;                    // finishBackward() below does it
  if (std::getenv("DDP_MINIMAL_FP16")) options.reducer.hook = std::make_shared<Fp16Compress>();  // fp16_compress.h
  aiacc::comm::DataParallel dp(model.ptr(), group.transports.primary, group.world, options);     // rank 0's weights
  if (rank == 0) std::printf("%s\n", dp.describe().c_str());  // transport, buckets, what travels
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 1; step <= 30; ++step) {
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    if (dp.finishBackward()) opt.step();  // the gradients averaged over the ranks (false: skip)
    if (step % 10 == 0 && rank == 0) std::printf("step %d: loss %.6f\n", step, loss.item<double>());
  }
  if (argc > 1) {  // the trained parameters, one value per line
    std::ofstream out(std::string(argv[1]) + "." + std::to_string(rank));
    for (const auto& p : model->parameters()) {
      const auto v = p.detach().flatten();
      for (int64_t i = 0; i < v.numel(); ++i) out << std::setprecision(9) << v[i].item<float>() << '\n';
    }
  }
  return 0;
}
