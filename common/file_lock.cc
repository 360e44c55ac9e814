#include "aiacc/common/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "aiacc/common/error.h"

namespace aiacc {

FileLock::FileLock(const std::string& path, std::chrono::milliseconds timeout) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) AIACC_THROW(IoError, "cannot open the lock file '", path, "': ", std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // (Polled, not a blocking flock: a holder that never lets go must not hold this process forever.)
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK || std::chrono::steady_clock::now() >= deadline) {
      ::close(fd_);
      if (err != EWOULDBLOCK) AIACC_THROW(IoError, "cannot lock '", path, "': ", std::strerror(err));
      AIACC_THROW(IoError, "cannot lock '", path, "': waited ", std::chrono::duration<double>(timeout).count(),
                  " s, and other processes still hold it (one stopped, or hung?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

FileLock::~FileLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace aiacc
