// CRC-32C (Castagnoli): the checksum of checkpoint manifests (common/checkpoint_dir.h), of TFRecord
// framing (app/tensorboard.h) and of iSCSI.
//
// The CRC with the reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF:
// crc32c("123456789") == 0xE3069283; 32 zero bytes give 0x8A9136AA (RFC 3720, B.4). On an x86-64
// CPU with SSE4.2 (checked once, at run time) by its crc32 instruction, 8 bytes at a time (about
// 8 GB/s here, the whole model's CRC of an elastic regroup's restore in ~11 ms instead of ~44);
// elsewhere slice-by-8 with tables built at compile time (about 2 GB/s), which crc32cPortable()
// always uses. Both give the same values.
//
// May call: the C++ standard library only. Thread-safe: no state but the CPU check's result,
// set once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace aiacc {

// CRC-32C of n bytes, continuing from `crc`, the CRC-32C of the bytes before (0 to start):
// crc32c(b, n) == crc32c(b + k, n - k, crc32c(b, k)) for every k <= n. `data` may be null when n is 0.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The same, by the tables only (tests compare the two).
uint32_t crc32cPortable(const void* data, size_t n, uint32_t crc = 0);
// crc32c() takes the CPU's instruction on this machine.
bool crc32cHasInstruction();

// TFRecord's masked CRC (a CRC of data that itself holds CRCs is a poor checksum, so the stored
// value is rotated right by 15 bits and offset): ((crc >> 15) | (crc << 17)) + 0xa282ead8, mod 2^32.
uint32_t maskedCrc32c(uint32_t crc);

// CRC-32C of data and its mask together: maskedCrc32c(crc32c(data, n)).
inline uint32_t maskedCrc32c(const void* data, size_t n) { return maskedCrc32c(crc32c(data, n)); }

}  // namespace aiacc
