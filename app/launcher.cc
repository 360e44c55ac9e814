#include "app/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "common/error.h"

extern char** environ;

namespace aiacc::app {
namespace {

std::optional<int> envInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    AIACC_THROW(InputError, "environment variable ", name, "='", v, "' is not an integer");
  }
}

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return strCat("was killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return strCat("exited with code ", WEXITSTATUS(status));
}

}  // namespace

std::pair<std::string, int> parseHostPort(const std::string& s) {
  const auto colon = s.rfind(':');
  AIACC_CHECK_INPUT(colon != std::string::npos && colon > 0, "--master '", s, "' must be host:port");
  int port = 0;
  try {
    port = std::stoi(s.substr(colon + 1));
  } catch (const std::exception&) {
    port = -1;
  }
  AIACC_CHECK_INPUT(port > 0 && port < 65536, "--master '", s, "': bad port");
  return {s.substr(0, colon), port};
}

std::optional<comm::WorldInfo> worldFromEnvironment() {
  struct Names {
    const char *rank, *world, *local_rank, *local_size;
  };
  const Names kinds[] = {
      {"AIACC_RANK", "AIACC_WORLD_SIZE", "AIACC_LOCAL_RANK", "AIACC_LOCAL_SIZE"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Names& n : kinds) {
    const auto rank = envInt(n.rank), world = envInt(n.world);
    if (!rank || !world) continue;
    comm::WorldInfo w;
    w.rank = *rank;
    w.world = *world;
    w.local_rank = envInt(n.local_rank).value_or(0);
    w.local_size = envInt(n.local_size).value_or(1);
    AIACC_CHECK_INPUT(w.world >= 1 && w.rank >= 0 && w.rank < w.world, n.rank, "=", w.rank, " and ",
                      n.world, "=", w.world, " are inconsistent");
    return w;
  }
  return std::nullopt;
}

int launchWorkers(const LaunchSpec& spec, const std::vector<std::string>& args) {
  AIACC_CHECK_INPUT(spec.nproc >= 1 && spec.nnodes >= 1 && spec.node_rank >= 0 &&
                        spec.node_rank < spec.nnodes,
                    "need --nproc >= 1 and 0 <= --node-rank < --nnodes");
  parseHostPort(spec.master);
  const int world = spec.nproc * spec.nnodes;
  std::vector<pid_t> pids(static_cast<size_t>(spec.nproc), -1);
  for (int local = 0; local < spec.nproc; ++local) {
    const int rank = spec.node_rank * spec.nproc + local;
    const pid_t pid = ::fork();
    AIACC_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::setenv("AIACC_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("AIACC_WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("AIACC_LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("AIACC_LOCAL_SIZE", std::to_string(spec.nproc).c_str(), 1);
      ::setenv("AIACC_MASTER", spec.master.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      std::cerr << "aiacc_train: cannot start worker: " << std::strerror(errno) << "\n";
      ::_exit(127);
    }
    pids[static_cast<size_t>(local)] = pid;
  }
  int alive = spec.nproc;
  int exit_code = 0;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int local = -1;
    for (int i = 0; i < spec.nproc; ++i) {
      if (pids[static_cast<size_t>(i)] == pid) local = i;
    }
    if (local < 0) continue;
    pids[static_cast<size_t>(local)] = -1;
    --alive;
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && exit_code == 0) {
      exit_code = 1;
      std::cerr << "aiacc_train: rank " << spec.node_rank * spec.nproc + local << " "
                << describeStatus(status) << "; stopping the other " << alive << " local worker(s)\n";
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, SIGTERM);
      }
      // Grace period, then SIGKILL whoever is left: no orphans.
      std::thread([pids]() {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        for (pid_t p : pids) {
          if (p > 0) ::kill(p, SIGKILL);
        }
      }).detach();
    }
  }
  return exit_code;
}

std::string localAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) {
    AIACC_THROW(InputError, "cannot resolve master host '", host, "'");
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  AIACC_CHECK_INPUT(!out.empty(), "no route to master host '", host, "' (check --master, or set --bind-host)");
  return out;
}

}  // namespace aiacc::app
