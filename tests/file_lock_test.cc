// common/file_lock.h: one holder at a time, whether the other holds it through another open of
// the file or from another process; a killed holder's lock is free at once; a wait that runs out
// is an IoError naming the file.
#include "aiacc/common/file_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "aiacc/common/error.h"
#include "tests/test_util.h"

namespace aiacc {
namespace {

using std::chrono::milliseconds;

// The IoError's message of a FileLock on `path` that waits `wait`; "" when it got the lock.
std::string lockError(const std::string& path, milliseconds wait) {
  try {
    FileLock lock(path, wait);
    return "";
  } catch (const IoError& e) {
    return e.what();
  }
}

TEST(FileLock, OneHolderAtATimeAndTheNextOnceItLetsGo) {
  test::TempDir d;
  const std::string path = d / "turn.lock";
  {
    FileLock held(path, milliseconds(100));
    EXPECT_EQ(lockError(path, milliseconds(100)),
              "cannot lock '" + path + "': waited 0.1 s, and other processes still hold it (one stopped, or hung?)");
  }
  EXPECT_EQ(lockError(path, milliseconds(100)), "");
  EXPECT_EQ(lockError(d / "missing/turn.lock", milliseconds(100)),
            "cannot open the lock file '" + (d / "missing/turn.lock") + "': No such file or directory");
}

// A waiter gets the lock as soon as its holder lets go, within its wait.
TEST(FileLock, AWaiterGetsItWhenTheHolderLetsGo) {
  test::TempDir d;
  const std::string path = d / "turn.lock";
  auto held = std::make_unique<FileLock>(path, milliseconds(100));
  std::thread let_go([&] {
    std::this_thread::sleep_for(milliseconds(200));
    held.reset();
  });
  EXPECT_EQ(lockError(path, std::chrono::seconds(60)), "");
  let_go.join();
}

// Another process takes the lock (the child: open, flock, say so, wait; system calls only, as
// after a fork in a process with threads) and is SIGKILLed: the kernel frees its lock.
TEST(FileLock, AKilledHoldersLockIsFreeAtOnce) {
  test::TempDir d;
  const std::string path = d / "turn.lock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // (should an assertion below end the test first)
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);  // the child holds the lock
  ::close(ready[0]);
  EXPECT_NE(lockError(path, milliseconds(100)), "");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(lockError(path, milliseconds(100)), "");
}

}  // namespace
}  // namespace aiacc
