// Command-line plumbing shared by aiacc_train and aiacc_bench: flag names with hyphens
// (--batch-size) become gflags' underscores, then gflags parses and glog starts (to stderr).
#pragma once

#include <gflags/gflags.h>

#include <ostream>
#include <string>
#include <vector>

namespace aiacc::app {

// The process-wide settings the communication library leaves to the program, made at once:
// SIGPIPE ignored (a dead peer's closed socket must become a CommError, not end this process;
// comm/gloo_transport.h) and ProcessGroupNCCL's environment (comm/nccl_env.h, values the user
// set are kept). The first thing main() does: before any thread starts (setenv races getenv in
// running threads; a launcher's workers inherit both).
void setUpProcess();

// Rewrites "--batch-size=8" as "--batch_size=8" (gflags only knows underscores). Leaves values
// and positional arguments alone.
std::vector<std::string> normalizeFlagNames(int argc, char** argv);

// "batch_size" -> "batch-size": a gflags name as users write it.
std::string hyphens(std::string name);

// The first problem gflags would end the process for (exit 1, with its own words) in `args`
// (normalizeFlagNames' output, argv[0] first): an unknown flag, a flag without its value, or a
// value its type (or a validator) refuses; "" when there is none. A usage error (exit 2,
// app/exit_code.h). The values it checks are set as the command line sets them anyway.
// Arguments after "--" and positional ones are left alone; with --undefok nothing is checked; a
// --flagfile's (or --fromenv's) contents are gflags' to read: their problems still exit 1.
std::string commandLineProblem(const std::vector<std::string>& args);

// Parses flags (hyphens or underscores), starts logging, and returns the positional arguments
// (argv[0] first). A commandLineProblem ends the process with one line and exit code 2.
std::vector<std::string> parseCommandLine(int argc, char** argv, const char* usage);

// Whether flag `f` is defined in a source file whose path ends with one of `sources` (e.g.
// "app/bench_main.cc"): a program's own flags, not the libraries' (Debian's LibTorch registers
// dozens of caffe2 flags with gflags).
bool flagDefinedIn(const gflags::CommandLineFlagInfo& f, const std::vector<std::string>& sources);
// Writes "--flag-name (type, default D)" and its description for each such flag, by name.
void printFlagsFrom(const std::vector<std::string>& sources, std::ostream& os);

}  // namespace aiacc::app
