#include "aiacc/common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>

#include "aiacc/common/error.h"

namespace aiacc {
namespace {

std::string tempPathFor(const std::string& path) { return strCat(path, ".tmp.", ::getpid(), ".", ::gettid()); }

std::string directoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  AIACC_THROW(IoError, "cannot write '", path, "': ", why);
}

[[noreturn]] void failRemoving(const std::string& path, const std::string& tmp, const std::string& why) {
  ::unlink(tmp.c_str());
  fail(path, why);
}

// Runs a caller's writer; if it throws, removes tmp and rethrows as the header says.
template <typename Fn>
void runWriter(const std::string& path, const std::string& tmp, Fn&& write) {
  try {
    write();
  } catch (const IoError& e) {
    failRemoving(path, tmp, e.what());
  } catch (const Error&) {
    ::unlink(tmp.c_str());
    throw;
  } catch (const std::exception& e) {
    failRemoving(path, tmp, e.what());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

// Writes every byte to fd; returns 0 or the errno of the failing write.
int writeAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    off += static_cast<size_t>(n);
  }
  return 0;
}

// fsyncs a temporary file a writer has filled and closed (fsync flushes the file, whichever
// descriptor it is called on).
void syncClosedFile(const std::string& path, const std::string& tmp) {
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) fail(path, "the writer did not create temporary file '" + tmp + "'");
    failRemoving(path, tmp, strCat("cannot open temporary file '", tmp, "': ", std::strerror(err)));
  }
  const int err = ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  if (err) failRemoving(path, tmp, strCat("cannot fsync temporary file '", tmp, "': ", std::strerror(err)));
}

// Renames the complete, fsynced tmp over path, then fsyncs the directory so the rename is durable.
void commit(const std::string& path, const std::string& tmp) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    failRemoving(path, tmp, strCat("cannot rename temporary file '", tmp, "' into place: ", std::strerror(err)));
  }
  const std::string dir = directoryOf(path);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(path, strCat("renamed into place, but cannot open directory '", dir, "': ", std::strerror(errno)));
  const int err = ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  if (err && err != EINVAL) {
    fail(path, strCat("renamed into place, but cannot fsync directory '", dir, "': ", std::strerror(err)));
  }
}

}  // namespace

void writeFileAtomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = tempPathFor(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, strCat("cannot create temporary file '", tmp, "': ", std::strerror(errno)));
  int err = writeAll(fd, bytes);
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) failRemoving(path, tmp, strCat("cannot write temporary file '", tmp, "': ", std::strerror(err)));
  commit(path, tmp);
}

void writeFileAtomicStream(const std::string& path, const std::function<void(std::ostream& out)>& write) {
  const std::string tmp = tempPathFor(path);
  {
    errno = 0;
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      fail(path, strCat("cannot create temporary file '", tmp, "': ", std::strerror(errno ? errno : EIO)));
    }
    runWriter(path, tmp, [&] { write(f); });
    errno = 0;
    f.close();  // flushes
    if (!f) {
      failRemoving(path, tmp,
                   strCat("cannot write temporary file '", tmp, "': ", errno ? std::strerror(errno) : "stream error"));
    }
  }
  syncClosedFile(path, tmp);
  commit(path, tmp);
}

void writeFileAtomicByPath(const std::string& path, const std::function<void(const std::string& tmp_path)>& write) {
  const std::string tmp = tempPathFor(path);
  // Such writers often report a failed open without the system's reason: a directory that cannot
  // take the temporary file is reported here first, with it.
  if (::access(directoryOf(path).c_str(), W_OK | X_OK) != 0) {
    fail(path, strCat("cannot create temporary file '", tmp, "': ", std::strerror(errno)));
  }
  runWriter(path, tmp, [&] { write(tmp); });
  syncClosedFile(path, tmp);
  commit(path, tmp);
}

}  // namespace aiacc
