// A program's own test of its failure path with aiacc::comm_testing (docs/comm.md, section 9):
// the example's training with rank 1's transport wrapped in a FaultTransport whose operation
// FAULT_AT (default 20: past DataParallel's set-up, within the 30 steps) fails. Each rank
// catches the error, prints it in one line and exits 1, as a program should (the example's
// main() does the same); tests/install_test.sh runs it on 2 processes and checks that both exit 1,
// and that rank 0's message names rank 1.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/fault_transport.h"

int main() try {
  auto group = aiacc::comm::initProcessGroup();  // torchrun's (or Slurm's, MPI's, ...) variables
  const int rank = group.world.rank, world = group.world.world;
  torch::manual_seed(0);
  auto x = torch::randn({64, 8});
  auto y = torch::sin(x.matmul(torch::linspace(-1, 1, 8)).unsqueeze(1));
  x = x.chunk(world)[rank], y = y.chunk(world)[rank];
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1));
  aiacc::comm::FaultSpec fault;
  if (rank == 1) {
    const char* at = std::getenv("FAULT_AT");
    fault.kind = aiacc::comm::FaultSpec::Kind::kFail;
    fault.at = at ? std::atoll(at) : 20;
  }
  auto faulty = std::make_shared<aiacc::comm::FaultTransport>(group.transports.primary, fault);
  aiacc::comm::DataParallel dp(model, faulty, group.world);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 1; step <= 30; ++step) {
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
    std::printf("step %d: %lld operations\n", step, static_cast<long long>(faulty->operations()));
  }
  std::printf("no fault struck\n");
  return 0;
} catch (const std::exception& e) {  // aiacc::comm::CommError among them: it names the failed rank
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
