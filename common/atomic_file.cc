#include "aiacc/common/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <vector>

#include "aiacc/common/error.h"

namespace aiacc {
namespace {

std::string tempPathFor(const std::string& path) {
  return strCat(path, ".tmp.", tempFileTag(), ".", ::getpid(), ".", ::gettid());
}

// A pid: decimal digits only, 1 to INT32_MAX (pid_t's range); -1 otherwise.
long pidNumber(const std::string& text) {
  if (text.empty() || text.size() > 10 || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  const long long n = std::stoll(text);
  return n > 0 && n <= 2147483647LL ? static_cast<long>(n) : -1;
}

// The first line of a small file under /proc, or "".
std::string procLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

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

const std::string& tempFileTag() {
  static const std::string tag = [] {
    const std::string boot = procLine("/proc/sys/kernel/random/boot_id");
    char link[128] = {};
    const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof(link) - 1);  // "pid:[4026531836]"
    const std::string ns = n > 0 ? std::string(link, static_cast<size_t>(n)) : "";
    const size_t open = ns.find('['), close = ns.find(']');
    std::string out;
    if (boot.size() >= 8 && open != std::string::npos && close != std::string::npos && close > open + 1) {
      out = boot.substr(0, 8) + "-" + ns.substr(open + 1, close - open - 1);
    } else {
      char host[256] = {};  // no /proc: the host's name, which at least tells hosts apart
      out = ::gethostname(host, sizeof(host) - 1) == 0 && host[0] ? host : "localhost";
    }
    for (char& ch : out) {  // (no dot: a temporary file's name is split at its dots)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-') ch = '_';
    }
    return out;
  }();
  return tag;
}

bool isOrphanedTempFile(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return false;
  // What follows: "<tag>.<pid>.<tid>", or "<pid>.<tid>" (earlier builds); a tag holds no dot.
  std::vector<std::string> parts;
  for (size_t from = at + 5;;) {
    const size_t dot = name.find('.', from);
    parts.push_back(name.substr(from, dot == std::string::npos ? std::string::npos : dot - from));
    if (dot == std::string::npos) break;
    from = dot + 1;
  }
  if (parts.size() != 2 && parts.size() != 3) return false;
  if (parts.size() == 3 && parts[0] != tempFileTag()) return false;  // another host's, or another pid namespace's
  const long pid = pidNumber(parts[parts.size() - 2]);
  if (pid < 0 || pidNumber(parts.back()) < 0 || pid == ::getpid()) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace aiacc
