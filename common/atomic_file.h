// Atomic file replacement: every file aiacc writes whole (checkpoints, --save-weights, the report,
// DAWNBench submissions, the timeline) goes through here, so a reader sees either the previous
// file or the complete new one, never a half-written one, even after a crash or a full disk.
//
// Contract, for every function below:
//  1. the content goes to a temporary file beside `path` (same directory, so the rename cannot
//     cross file systems), named `<path>.tmp.<tag>.<pid>.<tid>` (unique per process and thread;
//     <tag>, tempFileTag(), names the pid namespace, so that in a folder shared between hosts or
//     containers a pid is only ever looked up where it means something: isOrphanedTempFile);
//  2. the temporary file is fsynced, then renamed over `path`, then the directory is fsynced (a
//     file system that cannot fsync a directory, EINVAL, is accepted; a failing directory fsync
//     is the one failure after which `path` already holds the new content);
//  3. on any failure (cannot create, write, fsync or rename; the writer callback throws) the
//     temporary file is removed, `path` keeps its previous content (or stays absent), and an
//     aiacc::IoError is thrown whose one-line what() names `path` and the reason ("cannot write
//     'dir/x.json': cannot create temporary file 'dir/x.json.tmp.82ea5347-4026531836.7.7': No
//     such file or directory"). A writer's exception: an aiacc::Error other than IoError (a bad input, a
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

// What tells this process's pids apart from every other's in temporary file names: the first 8
// hex digits of this boot's id and the inode of this process's pid namespace ("82ea5347-4026531836";
// without /proc, the host's name). Letters, digits, '-' and '_' only.
const std::string& tempFileTag();

// Whether `name` (a file name, no folder) is named as a temporary file of the functions above
// whose writer is gone: a process killed mid-write left it, and nothing will rename it. Only a
// writer of this pid namespace can be known gone (its pid is looked up here); another host's or
// container's file, in a folder they share, never is (its pid means nothing here). A name without
// a tag (`<path>.tmp.<pid>.<tid>`, as earlier builds wrote them) counts as this namespace's.
// False for this process's own files and for names of another form; the caller checks that the
// part before ".tmp." is one of its own names.
bool isOrphanedTempFile(const std::string& name);

}  // namespace aiacc
