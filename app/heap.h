// Process heap settings for training (glibc malloc).
#pragma once

namespace aiacc {

// Keeps freed memory in the process heap instead of handing it back to the OS: blocks up to
// 32 MiB come from the heap (glibc's largest mmap threshold) and the heap's top is never trimmed.
// A training step frees and re-allocates the same activation and gradient tensors every time;
// with glibc's defaults each one above its (adaptive) mmap threshold is a fresh mmap whose
// pages fault in and are zeroed by the kernel, then munmapped at the end of the step: about a
// tenth of a CPU step (resnet18@64 bs16 on one thread: 50 -> 57 images/s). Call before
// threads start. Returns false where the C library does not support it (not glibc).
bool keepFreedMemoryInHeap();

}  // namespace aiacc
