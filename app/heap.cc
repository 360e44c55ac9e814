#include "app/heap.h"

#include <cstdlib>  // defines __GLIBC__ (through features.h) where the C library is glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace aiacc {

bool keepFreedMemoryInHeap() {
#if defined(__GLIBC__)
  // mallopt returns 1 on success; a fixed threshold also turns off glibc's adaptive one.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  const bool pad_ok = mallopt(M_TOP_PAD, 64 * 1024 * 1024) == 1;
  return mmap_ok && trim_ok && pad_ok;
#else
  return false;
#endif
}

}  // namespace aiacc
