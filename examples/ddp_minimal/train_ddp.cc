// ddp_minimal: a small network fitted to a fixed batch with SGD. train.cc runs on one process;
// train_ddp.cc is the same program on N processes with aiacc::comm (torchrun --no_python
// --nproc_per_node N train_ddp [PARAMS_FILE]); `diff -u train.cc train_ddp.cc` is the whole change.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <string>

#include "aiacc/comm/data_parallel.h"

// The training loop, in a function of its own: it does not change for N processes.
void train(torch::nn::Sequential model, torch::Tensor x, torch::Tensor y) {
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 1; step <= 30; ++step) {
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    opt.step();
    if (step % 10 == 0) std::printf("step %d: loss %.6f\n", step, loss.item<double>());
  }
}

int main(int argc, char** argv) try {
  // This process's place among the others, from torchrun's (or Slurm's, MPI's, ...) variables.
  auto group = aiacc::comm::initProcessGroup();
  torch::manual_seed(0);  // the same batch and initial weights in every process
  auto x = torch::randn({64, 8});
  auto y = torch::sin(x.matmul(torch::linspace(-1, 1, 8)).unsqueeze(1));
  x = x.chunk(group.world.world)[group.world.rank], y = y.chunk(group.world.world)[group.world.rank];  // my share
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1));
  aiacc::comm::DataParallel dp(model, group);  // rank 0's weights; gradients averaged inside backward()
  train(model, x, y);
  if (argc > 1) {  // the trained parameters, one value per line
    std::ofstream out(std::string(argv[1]) + "." + std::to_string(group.world.rank));
    for (const auto& p : model->parameters()) {
      const auto v = p.detach().flatten();
      for (int64_t i = 0; i < v.numel(); ++i) out << std::setprecision(9) << v[i].item<float>() << '\n';
    }
  }
  return 0;
} catch (const std::exception& e) {  // a comm::CommError names the rank that failed; exit 1: an error
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
