#include "app/cli.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>

#include "aiacc/comm/nccl_env.h"

namespace aiacc::app {

void setUpProcess() {
  ::signal(SIGPIPE, SIG_IGN);
  for (const auto& e : comm::kNcclEnvironment) ::setenv(e.name, e.value, /*overwrite=*/0);
}

std::vector<std::string> normalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.size() > 2 && a.rfind("--", 0) == 0) {
      const auto end = std::min(a.find('='), a.size());
      std::replace(a.begin() + 2, a.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
    }
    out.push_back(a);
  }
  return out;
}

std::string hyphens(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::vector<std::string> parseCommandLine(int argc, char** argv, const char* usage) {
  std::vector<std::string> args = normalizeFlagNames(argc, argv);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  int cargc = static_cast<int>(cargs.size());
  char** cargv = cargs.data();
  gflags::SetUsageMessage(usage);
  gflags::ParseCommandLineFlags(&cargc, &cargv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return std::vector<std::string>(cargv, cargv + cargc);
}

bool flagDefinedIn(const gflags::CommandLineFlagInfo& f, const std::vector<std::string>& sources) {
  return std::any_of(sources.begin(), sources.end(), [&](const std::string& s) {
    return f.filename.size() >= s.size() && f.filename.compare(f.filename.size() - s.size(), s.size(), s) == 0;
  });
}

void printFlagsFrom(const std::vector<std::string>& sources, std::ostream& os) {
  std::vector<gflags::CommandLineFlagInfo> all, flags;
  gflags::GetAllFlags(&all);
  for (auto& f : all) {
    if (flagDefinedIn(f, sources)) flags.push_back(std::move(f));
  }
  std::sort(flags.begin(), flags.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& f : flags) {
    os << "  --" << hyphens(f.name) << " (" << f.type << ", default "
       << (f.default_value.empty() ? "\"\"" : f.default_value) << ")\n      " << f.description << "\n";
  }
}

}  // namespace aiacc::app
