// The run's records beside its report (--report-file DIR/NAME.json), written by rank 0 at the end:
//   DIR/summary.csv  one row per epoch trained, timm's columns:
//                    epoch,train_loss,eval_loss,eval_top1,eval_top5,lr
//                    (train_loss: the job's mean loss over the epoch's images; lr: its last step's;
//                    eval_*: the last evaluation within the epoch, empty when there was none; a
//                    last epoch the run stopped inside has a fractional epoch, e.g. 2.4)
//   DIR/args.json    every aiacc_train flag's resolved value (after the recipe and the command
//                    line), typed as the flag is: true/false, numbers, strings
//   DIR/args.flags   the flags the command line gave, as --name=value lines: `aiacc_train
//                    --flagfile DIR/args.flags` reruns the same settings (a later --flag
//                    overrides one; a --recipe in it must still exist). Not every resolved value:
//                    whether a flag was given decides some settings (app/config.h, given_flags).
// Folder names are fixed (timm's): one run per folder, or a later run replaces them. Each file is
// replaced atomically (common/atomic_file.h); an IoError names the file.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "app/report.h"

namespace aiacc::app {

// summary.csv's text for these epochs and evaluations.
std::string summaryCsv(const std::vector<EpochTrain>& epochs, const std::vector<EvalPoint>& evals);

// args.json's text: each (flag name, gflags value) typed by the flag's gflags type.
std::string argsJson(const std::vector<std::pair<std::string, std::string>>& flags);

// args.flags's text: "--name=value" lines.
std::string argsFlags(const std::vector<std::pair<std::string, std::string>>& flags);

// Writes the three files into the report file's folder: args.json from `resolved`, args.flags
// from `given`.
void writeRunRecords(const std::string& report_file, const Report& r,
                     const std::vector<std::pair<std::string, std::string>>& resolved,
                     const std::vector<std::pair<std::string, std::string>>& given);

}  // namespace aiacc::app
