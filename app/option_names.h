// The names of the typed options' values, as the flags write them: one table per enum, read by
// the flag parser (app/flags.cc: value from name, and the allowed names in its error messages),
// the agreement settings (app/job_settings.cc) and the log and report lines.
#pragma once

#include <optional>
#include <string>

#include "app/config.h"
#include "aiacc/comm/data_parallel.h"
#include "aiacc/comm/factory.h"

namespace aiacc::app {

// The flag's name for a value: "fp16", "lazy", "auto", "cosine", ...
const char* optionName(comm::TransferDtype v);  // --allreduce-dtype fp32 | fp16 | bf16
const char* optionName(comm::BufferSync v);     // --bn-sync lazy | average | broadcast | none
const char* optionName(comm::TwoLevelMode v);   // --hierarchical on | off | auto
const char* optionName(AmpDtype v);             // --amp-dtype fp16 | bf16
const char* optionName(LrSchedule v);           // --lr-schedule cosine | step | linear
const char* optionName(ElasticBatch v);         // --elastic-batch keep-per-rank | keep-global

// aiacc_train's flags for the setting a CommError says to change (comm speaks of "the store's
// port", "the bucket size"): " (aiacc_train: --bucket-mb)", appended to the message; "" when the
// error names no setting.
std::string flagHint(comm::CommError::Remedy remedy);

// The value a flag's name stands for; nullopt for anything else.
template <typename E>
std::optional<E> optionFromName(const std::string& name);

// The allowed names in a message's words, in table order: "fp32, fp16 or bf16"; `extra`
// (e.g. "auto", a name the flag takes besides the enum's) comes last.
template <typename E>
std::string optionNames(const char* extra = nullptr);

// Throws the InputError of parseOption.
[[noreturn]] void throwBadOption(const char* flag, const std::string& allowed, const std::string& got);

// The value for `text`, else an InputError of one line naming the flag and the allowed values:
// "--bn-sync must be lazy, average, broadcast or none (got 'x')".
template <typename E>
E parseOption(const char* flag, const std::string& text) {
  const std::optional<E> v = optionFromName<E>(text);
  if (!v) throwBadOption(flag, optionNames<E>(), text);
  return *v;
}

}  // namespace aiacc::app
