#include "aiacc/common/crc32c.h"

#include <cstring>

namespace aiacc {
namespace {

// Slice-by-8: t[0] is the byte-at-a-time table of the reflected polynomial; t[k][b] is the CRC
// contribution of byte b followed by k zero bytes, so eight bytes are folded in with eight lookups
// that do not depend on each other.
struct Tables {
  uint32_t t[8][256];
};

constexpr Tables makeTables() {
  Tables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    tables.t[0][i] = c;
  }
  for (int s = 1; s < 8; ++s) {
    for (int i = 0; i < 256; ++i) tables.t[s][i] = (tables.t[s - 1][i] >> 8) ^ tables.t[0][tables.t[s - 1][i] & 0xff];
  }
  return tables;
}

constexpr Tables kTables = makeTables();
static_assert(kTables.t[0][1] == 0xF26B8303u, "CRC-32C: t[0][1] differs from the published table");

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AIACC_CRC32C_SSE42 1
// The crc32 instruction computes CRC-32C (the Castagnoli polynomial, reflected): 8 bytes per
// instruction, one dependency chain. Compiled for SSE4.2 here only; called only where the CPU
// has it.
__attribute__((target("sse4.2"))) uint32_t crc32cSse42(const unsigned char* p, size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // (unaligned loads are fine on x86)
    c = __builtin_ia32_crc32di(c, v);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return ~c32;
}
#else
#define AIACC_CRC32C_SSE42 0
#endif

}  // namespace

bool crc32cHasInstruction() {
#if AIACC_CRC32C_SSE42
  static const bool sse42 = [] {
    __builtin_cpu_init();  // (valid even when called before the library's own initialisers ran)
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return sse42;
#else
  return false;
#endif
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if AIACC_CRC32C_SSE42
  if (crc32cHasInstruction()) return crc32cSse42(static_cast<const unsigned char*>(data), n, crc);
#endif
  return crc32cPortable(data, n, crc);
}

uint32_t crc32cPortable(const void* data, size_t n, uint32_t crc) {
  const auto& t = kTables.t;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    // Little-endian assembly of the first four bytes, whatever the host's byte order.
    const uint32_t lo = crc ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
  return ~crc;
}

uint32_t maskedCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace aiacc
