// Atomic file replacement: every file aiacc writes whole (checkpoints, --save-weights, the report,
// DAWNBench submissions, the timeline) goes through here, so a reader sees either the previous
// file or the complete new one, never a half-written one, even after a crash or a full disk.
//
// Contract, for every function below:
//  1. the content goes to a temporary file beside `path` (same directory, so the rename cannot
//     cross file systems), named `<path>.tmp.<pid>.<tid>` (unique per process and thread);
//  2. the temporary file is fsynced, then renamed over `path`, then the directory is fsynced (a
//     file system that cannot fsync a directory, EINVAL, is accepted; a failing directory fsync
//     is the one failure after which `path` already holds the new content);
//  3. on any failure (cannot create, write, fsync or rename; the writer callback throws) the
//     temporary file is removed, `path` keeps its previous content (or stays absent), and an
//     aiacc::IoError is thrown whose one-line what() names `path` and the reason ("cannot write
//     'dir/x.json': cannot create temporary file 'dir/x.json.tmp.7.7': No such file or
//     directory"). A writer's exception: an aiacc::Error other than IoError (a bad input, a
//     broken invariant) is rethrown unchanged; any other std::exception, IoError included,
//     becomes an IoError "cannot write '<path>': <its what()>".
// Two threads or processes may write the same path at once: each has its own temporary file and
// the last rename wins. The directory must exist: it is not created.
//
// May call: POSIX (open, write, fsync, rename, unlink), the C++ standard library and
// common/error.h. Nothing from LibTorch, nothing above common/.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>

namespace aiacc {

// Replaces `path` with `bytes` (text or binary), written with plain POSIX calls.
void writeFileAtomic(const std::string& path, const std::string& bytes);

// Replaces `path` with what `write` puts into the stream (an std::ofstream on the temporary file,
// opened binary). Stream errors (badbit/failbit after the writer and after closing) are failures.
void writeFileAtomicStream(const std::string& path, const std::function<void(std::ostream& out)>& write);

// Replaces `path` with the file `write` creates at `tmp_path` (for writers that take a file name:
// torch::save, models::writeNamedTensors). The writer must create tmp_path; not creating it is a
// failure. A directory the temporary file cannot be created in is reported before the writer runs.
void writeFileAtomicByPath(const std::string& path, const std::function<void(const std::string& tmp_path)>& write);

}  // namespace aiacc
