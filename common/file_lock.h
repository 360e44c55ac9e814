// An exclusive advisory lock that processes take in turn: for writers of one folder on several
// processes (or hosts sharing it) that must not write at once, with nothing to coordinate them
// but the folder itself (the survivors of an elastic job that lost its store, saving their state).
//
// flock(2) on a lock file: the kernel releases the lock when its holder closes it or dies, so a
// killed holder never leaves it taken, and the file may stay. On NFS, Linux emulates flock with
// fcntl byte-range locks, which the NFS lock manager shares between hosts; a lock held by a host
// that died is freed only when its lease ends (NFSv4: about 90 s). Mounted with `nolock` or
// `local_lock=flock` (NFS) or `localflock` (Lustre), it locks per host only: processes on
// different hosts may then hold it at once.
//
// May call: POSIX, the C++ standard library and common/error.h. No LibTorch.
#pragma once

#include <chrono>
#include <string>

namespace aiacc {

class FileLock {
 public:
  // Opens (creates) `path` and waits until this process holds its lock. Throws IoError naming
  // `path` when it cannot be opened or locked (a file system with no such locks: flock's ENOSYS,
  // ENOLCK or EOPNOTSUPP, as Lustre's default `noflock` or NFS with no lock manager give), or
  // when it waited `timeout` and other processes still held the lock (a holder that is stopped or
  // hung, or a long queue).
  FileLock(const std::string& path, std::chrono::milliseconds timeout);
  ~FileLock();  // releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace aiacc
