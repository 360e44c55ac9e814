#include "app/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <tuple>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "app/exit_code.h"
#include "app/launch_env.h"
#include "app/store_serving.h"
#include "app/stop_signal.h"
#include "aiacc/comm/membership.h"
#include "aiacc/comm/store.h"
#include "aiacc/common/error.h"

extern char** environ;

namespace aiacc::app {
namespace {

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return strCat("was killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return strCat("exited with code ", WEXITSTATUS(status));
}

}  // namespace

void checkGraceSeconds(int seconds) {
  AIACC_CHECK_INPUT(seconds >= 1 && seconds <= kMaxGraceSeconds, "--grace-seconds must be 1..", kMaxGraceSeconds,
                    " (got ", seconds, ")");
}

std::pair<std::string, int> parseHostPort(const std::string& s) { return comm::parseHostPort(s, "--master"); }

std::optional<comm::WorldInfo> worldFromEnvironment() {
  const LaunchEnv env = detectLaunch(currentEnvironment());
  if (env.source == LaunchSource::kNone || !env.per_process) return std::nullopt;
  return env.world;
}

namespace {

// One worker as the launcher sees it.
struct Worker {
  int rank = 0;
  pid_t pid = -1;             // -1 once reaped
  std::optional<int> status;  // its wait status, once reaped
  int out = -1, err = -1;     // read ends of its stdout / stderr pipes (-1: closed or --log-dir)
  std::string out_buf, err_buf;
  int starts = 0;  // times started (an elastic job starts a dead worker again)
};

void writeAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Moves the complete lines of `buf` (all of it when `eof`) to `fd`, each after `prefix`.
void forwardLines(std::string& buf, int fd, const std::string& prefix, bool eof) {
  std::string out;
  size_t begin = 0;
  for (size_t nl; (nl = buf.find('\n', begin)) != std::string::npos; begin = nl + 1) {
    out += prefix;
    out.append(buf, begin, nl + 1 - begin);
  }
  buf.erase(0, begin);
  if ((eof || buf.size() > 65536) && !buf.empty()) {  // a last line without newline, or a huge one
    out += prefix + buf + "\n";
    buf.clear();
  }
  if (!out.empty()) writeAll(fd, out);
}

// Reads what is there on `fd` into `buf`; returns false at end of file (and closes it).
bool drain(int& fd, std::string& buf) {
  char chunk[16384];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      if (n < static_cast<ssize_t>(sizeof(chunk))) return true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    ::close(fd);
    fd = -1;
    return false;
  }
}

// The worker's environment: ours, with the AIACC_* rank variables replaced.
std::vector<std::string> workerEnvironment(const LaunchSpec& spec, int rank, int local) {
  std::vector<std::string> env;
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"AIACC_JOB_ID", spec.job_id},
      {"AIACC_RANK", std::to_string(rank)},
      {"AIACC_WORLD_SIZE", std::to_string(spec.nproc * spec.nnodes)},
      {"AIACC_LOCAL_RANK", std::to_string(local)},
      {"AIACC_LOCAL_SIZE", std::to_string(spec.nproc)},
      {"AIACC_MASTER", spec.master},
      {"AIACC_MASTER_PORTS", std::to_string(spec.master_ports)},
      {"AIACC_LAUNCHER_STORE", spec.host_store || spec.external_store ? "1" : "0"},
      {"AIACC_ELASTIC_MIN_NODES", std::to_string(spec.min_nodes)}};
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [k, v] : ours) replaced = replaced || kv.rfind(k + "=", 0) == 0;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  return env;
}

bool exitedWith(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }

// Whether the job's end is recorded in its rendezvous store (comm::markJobEnded / markJobFailed:
// an elastic job's last rank 0, a survivor that stopped it, or every rank of a generation
// failing). A worker of an elastic job that ended after that is not started again: there is
// nothing left to join. Asked of the store this launcher hosts, else as a client of the job's
// (a store that cannot be reached within about kAskFor, twice for LibTorch's two connections,
// or, where the store may be at several ports, not found within a round of looks at them, says
// nothing, and the worker is started again to find out for itself).
bool jobEndRecorded(const c10::intrusive_ptr<c10d::Store>& hosted, const LaunchSpec& spec) {
  constexpr auto kAskFor = std::chrono::seconds(2);
  try {
    if (hosted) {
      c10d::PrefixStore store(comm::StoreOptions{}.prefix, hosted);
      return comm::jobEnded(store);
    }
    comm::StoreOptions o;
    std::tie(o.host, o.port) = parseHostPort(spec.master);
    o.client_only = true;
    o.timeout = kAskFor;
    o.port_tries = spec.master_ports;
    if (o.port_tries > 1) o.job = spec.job_id;
    return comm::jobEnded(*comm::makeTcpStore(o));
  } catch (const std::exception&) {
    return false;
  }
}

// The launcher's exit code once its workers have ended (app/exit_code.h), with its line on stderr.
int jobExitCode(const std::vector<Worker>& workers, bool failed, int first_signal) {
  std::vector<WorkerExit> ends;
  for (const Worker& w : workers) {
    WorkerExit e;
    if (!w.status) {
      e.code = kExitError;  // (never reaped)
    } else if (WIFSIGNALED(*w.status)) {
      e.signal = WTERMSIG(*w.status);
    } else {
      e.code = WEXITSTATUS(*w.status);
    }
    ends.push_back(e);
  }
  const LauncherEnd end = launcherExitCode(ends, failed, first_signal);
  if (!end.line.empty()) std::cerr << end.line << "\n";
  return end.code;
}

}  // namespace

// The id the ranks claim the store under when --job-id is not given: fresh for one node (host,
// launcher pid, time); for several nodes the same on each (layout and master), since every
// node's launcher makes its own.
std::string defaultJobId(const LaunchSpec& spec) {
  if (spec.nnodes > 1) return strCat("aiacc-", spec.nnodes, "x", spec.nproc, "@", spec.master);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  return strCat("aiacc-", host, "-", ::getpid(), "-", ms);
}

// The launcher's loop. Workers run in a process group of their own (the first worker leads it),
// so that stopping the job reaches whatever they started; each dies with the launcher
// (PR_SET_PDEATHSIG), even when it is SIGKILLed. SIGINT, SIGTERM and SIGUSR1 are not acted on by
// default but read from a signalfd (blocked in this thread, reset and unblocked in the children
// before exec): forwarded to the group, then SIGKILL after the grace period, or at once on the
// same signal again. A worker that fails stops the rest the same way (SIGTERM); one that exits
// kExitPreempted does not. Workers' output comes through pipes, each line prefixed with
// "[rank R] ", or goes to --log-dir files.
int launchWorkers(const LaunchSpec& given, const std::vector<std::string>& args) {
  LaunchSpec spec = given;
  if (spec.job_id.empty()) spec.job_id = defaultJobId(spec);
  AIACC_CHECK_INPUT(spec.nproc >= 1 && spec.nnodes >= 1 && spec.node_rank >= 0 && spec.node_rank < spec.nnodes,
                    "need --nproc >= 1 and 0 <= --node-rank < --nnodes");
  AIACC_CHECK_INPUT(spec.max_restarts == 0 || spec.min_nodes > 0,
                    "--max-restarts needs an elastic job (--nnodes MIN:MAX): without one a lost rank ends the job");
  parseHostPort(spec.master);
  checkGraceSeconds(spec.grace_seconds);
  const auto grace = std::chrono::seconds(spec.grace_seconds);
  if (!spec.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(spec.log_dir, ec);
    AIACC_CHECK_INPUT(!ec, "cannot create --log-dir '", spec.log_dir, "': ", ec.message());
  }
  sigset_t handled, old_mask;
  sigemptyset(&handled);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGCHLD}) sigaddset(&handled, sig);
  AIACC_CHECK(::pthread_sigmask(SIG_BLOCK, &handled, &old_mask) == 0, "cannot block signals");
  const int sfd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  AIACC_CHECK(sfd >= 0, "signalfd failed: ", std::strerror(errno));

  // After the signals are blocked: the store's threads inherit the mask, so that SIGTERM and
  // SIGINT reach only the signalfd.
  c10::intrusive_ptr<c10d::Store> store;
  if (spec.host_store && !spec.external_store && spec.node_rank == 0) {
    const bool pick = spec.pick_port && spec.nnodes == 1;
    const auto [host, port] = parseHostPort(spec.master);
    if (spec.master_ports > 1 && !pick) {
      comm::StoreOptions o;
      o.port = port;
      o.port_tries = spec.master_ports;
      o.world = spec.nproc * spec.nnodes;
      o.timeout = spec.store_timeout;
      o.job = spec.job_id;
      store = comm::hostJobStore(o);
      spec.master_ports = 1;  // (this node's workers: the port it took)
      if (const int taken = comm::hostedPort(*store); taken != port) {
        std::cerr << "aiacc_train: port " << port << " of job " << spec.job_id
                  << " is taken; its rendezvous store is at " << host << ":" << taken << "\n";
      }
    } else {
      store = comm::hostStore(pick ? 0 : port, spec.nproc * spec.nnodes, spec.store_timeout);
    }
    spec.master = strCat(host, ":", comm::hostedPort(*store));
  }

  const pid_t launcher = ::getpid();
  const char* const executable = spec.executable.c_str();
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<Worker> workers(static_cast<size_t>(spec.nproc));
  pid_t group = 0;
  std::vector<int> restart;  // an elastic job's workers to start again (local indexes)
  // Starts local worker `local` (again, in an elastic job: its log file is appended to).
  auto spawn = [&](int local) {
    Worker& w = workers[static_cast<size_t>(local)];
    w.rank = spec.node_rank * spec.nproc + local;
    // Everything the child needs is made before fork: it only calls async-signal-safe functions.
    const std::vector<std::string> env_strings = workerEnvironment(spec, w.rank, local);
    std::vector<char*> envp;
    for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, log_fd = -1;
    if (spec.log_dir.empty()) {
      AIACC_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
                  "pipe failed: ", std::strerror(errno));
    } else {
      const std::string path = strCat(spec.log_dir, "/rank-", w.rank, ".log");
      log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | (w.starts > 0 ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
      AIACC_CHECK_INPUT(log_fd >= 0, "cannot write '", path, "': ", std::strerror(errno));
    }
    const pid_t pid = ::fork();
    AIACC_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
    if (pid == 0) {
      // Die with the launcher; if it died before prctl took effect, our parent is already another.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(1);
      ::setpgid(0, group);
      ::dup2(log_fd >= 0 ? log_fd : out_pipe[1], STDOUT_FILENO);
      ::dup2(log_fd >= 0 ? log_fd : err_pipe[1], STDERR_FILENO);
      // The launcher decides when workers stop: what it forwards must not be ignored (a shell's
      // background job, for one, starts with SIGINT ignored).
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGUSR1, SIG_DFL);
      ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
      ::execve(executable, argv.data(), envp.data());
      static const char kMsg[] = "aiacc_train: cannot start worker (execve failed)\n";
      if (::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1) < 0) {
      }
      ::_exit(127);
    }
    if (group == 0) group = pid;
    ::setpgid(pid, group);  // also here: whichever runs first; EACCES after its exec is fine
    w.pid = pid;
    if (log_fd >= 0) ::close(log_fd);
    if (out_pipe[1] >= 0) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      w.out = out_pipe[0];
      w.err = err_pipe[0];
      ::fcntl(w.out, F_SETFL, O_NONBLOCK);
      ::fcntl(w.err, F_SETFL, O_NONBLOCK);
    }
    ++w.starts;
  };
  for (int local = 0; local < spec.nproc; ++local) spawn(local);
  if (!spec.log_dir.empty()) {
    std::cerr << "aiacc_train: worker output in " << spec.log_dir << "/rank-<R>.log\n";
  }

  using Clock = std::chrono::steady_clock;
  // kRunning until a signal or a failure stops the job; kStopping: signal forwarded, SIGKILL at
  // kill_at (the grace period runs); kKilled: SIGKILL sent.
  enum class Phase { kRunning, kStopping, kKilled };
  Phase phase = Phase::kRunning;
  Clock::time_point kill_at;
  int alive = spec.nproc;
  bool failed = false;         // a worker failed before any signal was forwarded
  std::vector<int> forwarded;  // the stop signals forwarded, each kind once, in order
  auto stop = [&](int sig) {
    if (alive > 0) ::kill(-group, sig);
    if (phase != Phase::kRunning) return;  // the grace period runs once, from the first stop
    phase = Phase::kStopping;
    kill_at = Clock::now() + grace;
  };
  auto killAll = [&]() {
    if (alive > 0) ::kill(-group, SIGKILL);
    phase = Phase::kKilled;
  };
  // ", SIGKILL in N s if they do not end" while the grace period runs.
  auto graceLeft = [&](const char* still) -> std::string {
    if (phase != Phase::kStopping) return "";
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count();
    return strCat(", SIGKILL ", still, "in ", std::max<int64_t>(0, (ms + 999) / 1000), " s if they do not end");
  };
  auto onSignal = [&](int sig) {
    if (std::find(forwarded.begin(), forwarded.end(), sig) != forwarded.end()) {  // the same again: no grace
      std::cerr << "aiacc_train: received " << signalName(sig) << " again; sending SIGKILL to the " << alive
                << " worker(s)\n";
      killAll();
      return;
    }
    forwarded.push_back(sig);
    stop(sig);  // the first signal starts the grace period; later ones keep it
    std::cerr << "aiacc_train: received " << signalName(sig)
              << (forwarded.size() > 1 ? " after " + signalName(forwarded.front()) : std::string())
              << "; forwarding it to the " << alive << " worker(s)" << graceLeft(forwarded.size() > 1 ? "still " : "")
              << "\n";
  };
  auto reap = [&]() {
    std::optional<bool> ended;  // the store asked once per pass (several workers may end at once)
    auto endRecorded = [&] {
      if (!ended) ended = jobEndRecorded(store, spec);
      return *ended;
    };
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (Worker& w : workers) {
        if (w.pid != pid) continue;
        w.pid = -1;
        w.status = status;
        --alive;
        // A worker that saved and stopped (75) is not a failure: the others agreed on the same
        // stop and follow. After a forwarded signal no exit is one: the job is being stopped.
        const bool clean = exitedWith(status, 0) || exitedWith(status, kExitPreempted);
        // An elastic job: the job's other ranks regroup without it; it is started again to
        // join them while --max-restarts allows.
        if (!clean && spec.min_nodes > 0 && forwarded.empty()) {
          if (endRecorded()) {  // nothing left to join: no restart
            failed = true;
            std::cerr << "aiacc_train: rank " << w.rank << " " << describeStatus(status)
                      << " after the job's end was recorded; not starting it again\n";
          } else if (w.starts <= spec.max_restarts) {
            std::cerr << "aiacc_train: rank " << w.rank << " " << describeStatus(status)
                      << "; starting it again to join the running job (restart " << w.starts << " of "
                      << spec.max_restarts << ")\n";
            restart.push_back(static_cast<int>(&w - workers.data()));
          } else {
            failed = true;
            std::cerr << "aiacc_train: rank " << w.rank << " " << describeStatus(status) << "; the job's other ranks "
                      << "go on without it (elastic" << (spec.max_restarts > 0 ? ", no restart left" : "") << ")\n";
          }
          continue;
        }
        if (!clean && !failed && forwarded.empty()) {
          failed = true;
          std::cerr << "aiacc_train: rank " << w.rank << " " << describeStatus(status) << "; stopping the other "
                    << alive << " local worker(s)\n";
          stop(SIGTERM);
        }
      }
    }
  };
  auto pipesOpen = [&]() {
    for (const Worker& w : workers) {
      if (w.out >= 0 || w.err >= 0) return true;
    }
    return false;
  };
  std::optional<Clock::time_point> pipes_deadline;  // after the last worker: what is left to read
  while (alive > 0 || pipesOpen()) {
    if (alive == 0 && !pipes_deadline) pipes_deadline = Clock::now() + std::chrono::seconds(2);
    if (pipes_deadline && Clock::now() > *pipes_deadline) break;  // a descendant holds a pipe open
    std::vector<pollfd> fds{{sfd, POLLIN, 0}};
    for (const Worker& w : workers) {
      if (w.out >= 0) fds.push_back({w.out, POLLIN, 0});
      if (w.err >= 0) fds.push_back({w.err, POLLIN, 0});
    }
    int timeout_ms = -1;
    std::optional<Clock::time_point> until = pipes_deadline;
    if (!until && phase == Phase::kStopping) until = kill_at;
    if (until) {
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(*until - Clock::now()).count()) +
          1);
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    signalfd_siginfo si{};
    while (::read(sfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig != SIGCHLD) onSignal(sig);
    }
    reap();
    for (const int local : std::exchange(restart, {})) {
      Worker& w = workers[static_cast<size_t>(local)];
      const std::string prefix = strCat("[rank ", w.rank, "] ");
      for (int* fd : {&w.out, &w.err}) {  // what the dead process wrote, then its pipes closed
        std::string& buf = fd == &w.out ? w.out_buf : w.err_buf;
        if (*fd >= 0) {
          drain(*fd, buf);
          ::close(*fd);
          *fd = -1;
        }
        forwardLines(buf, fd == &w.out ? STDOUT_FILENO : STDERR_FILENO, prefix, true);
      }
      if (alive == 0) group = 0;  // the old group has no member left: the new worker leads one
      spawn(local);
      w.status.reset();
      ++alive;
    }
    for (Worker& w : workers) {
      const std::string prefix = strCat("[rank ", w.rank, "] ");
      if (w.out >= 0 && !drain(w.out, w.out_buf)) forwardLines(w.out_buf, STDOUT_FILENO, prefix, true);
      forwardLines(w.out_buf, STDOUT_FILENO, prefix, false);
      if (w.err >= 0 && !drain(w.err, w.err_buf)) forwardLines(w.err_buf, STDERR_FILENO, prefix, true);
      forwardLines(w.err_buf, STDERR_FILENO, prefix, false);
    }
    if (phase == Phase::kStopping && Clock::now() >= kill_at) {
      if (alive > 0) {
        std::cerr << "aiacc_train: sending SIGKILL to the " << alive << " worker(s) still running after the "
                  << spec.grace_seconds << " s grace period\n";
      }
      killAll();
    }
  }
  for (Worker& w : workers) {
    const std::string prefix = strCat("[rank ", w.rank, "] ");
    forwardLines(w.out_buf, STDOUT_FILENO, prefix, true);
    forwardLines(w.err_buf, STDERR_FILENO, prefix, true);
    if (w.out >= 0) ::close(w.out);
    if (w.err >= 0) ::close(w.err);
  }
  if (store && spec.min_nodes > 0 && forwarded.empty()) keepStoreUntilTheJobEnds(store, spec, sfd);
  ::close(sfd);
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return jobExitCode(workers, failed, forwarded.empty() ? 0 : forwarded.front());
}

}  // namespace aiacc::app
