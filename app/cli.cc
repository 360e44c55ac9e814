#include "app/cli.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "app/exit_code.h"
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

std::string commandLineProblem(const std::vector<std::string>& args) {
  for (const std::string& a : args) {  // --undefok: gflags' own leave to pass unknown names
    if (a.rfind("--undefok", 0) == 0 || a.rfind("-undefok", 0) == 0) return "";
  }
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;  // a positional argument
    const std::string body = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      // --nofoo for a boolean foo
      const bool negated = name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
                           info.type == "bool";
      if (!negated) return "unknown flag --" + hyphens(name);
      continue;
    }
    if (info.type == "bool" && eq == std::string::npos) continue;  // --foo: true
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return "flag --" + hyphens(name) + " needs a value";
    }
    if (name == "flagfile" || name == "fromenv" || name == "tryfromenv") continue;  // (gflags' own)
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
      return "--" + hyphens(name) + ": '" + value + "' is not a valid value (" + info.type + ")";
    }
  }
  return "";
}

std::vector<std::string> parseCommandLine(int argc, char** argv, const char* usage) {
  std::vector<std::string> args = normalizeFlagNames(argc, argv);
  if (const std::string problem = commandLineProblem(args); !problem.empty()) {
    const std::string program = args[0].substr(args[0].rfind('/') + 1);  // (npos + 1: all of it)
    std::cerr << program << ": error: " << problem << " (see --help)\n";
    std::exit(kExitUsage);
  }
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
