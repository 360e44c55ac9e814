// aiacc_train's tool commands, which train nothing: --make-sample DIR writes the sample dataset
// (data/sample_gen.h), --convert-weights IN --save-weights OUT rewrites a weights file
// (models/torch_format.h). Each returns the process's exit code (app/exit_code.h); an error in
// the work itself is thrown (aiacc::Error), for main() to say in one line.
#pragma once

namespace aiacc::app {

// Whether the command line asks for a tool (--make-sample or --convert-weights).
bool toolRequested();

// Runs the tool the flags ask for (toolRequested()); with --dry-run, says what it would do.
int runTool(bool dry_run);

}  // namespace aiacc::app
