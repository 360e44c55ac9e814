// JPEG entropy-coding primitives for the index (data/jpeg_index.h): Huffman tables, header
// parsing up to the scan, byte unstuffing, a block walker that skips coefficients as
// libjpeg-turbo's decoder consumes them, and a bit writer that stuffs. Internal to aiacc_data.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace aiacc::data::jpeg {

inline uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

inline uint64_t load64be(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

// A Huffman table (JPEG Annex C canonical codes): a 9-bit lookahead table for short codes, the
// per-length bounds for longer ones, and the encoder's code for each symbol.
struct Huffman {
  static constexpr int kFast = 9;
  bool present = false;
  std::array<uint16_t, 1 << kFast> fast{};  // (length << 8) | symbol; 0: longer than kFast
  std::array<int32_t, 18> maxcode{};        // largest code of each length, -1 when none
  std::array<int32_t, 17> valoff{};         // vals index minus the first code of each length
  std::array<uint8_t, 256> vals{};
  std::array<uint16_t, 256> code{};
  std::array<uint8_t, 256> size{};   // 0: the symbol has no code
  std::array<uint8_t, 16> counts{};  // the DHT's code counts per length (with vals: the table)
  int nsym = 0;

  bool build(const uint8_t* bits /* [16]: codes of length 1..16 */, const uint8_t* symbols);

  // Coefficient positions an AC symbol advances (64 for end-of-block), as libjpeg-turbo counts.
  static int advance(int rs) {
    const int r = rs >> 4, s = rs & 15;
    return s ? r + 1 : r == 15 ? 16 : 64;
  }

  // Decodes one symbol from the next 32 bits (most significant first). Returns its code length,
  // 0 for a bit pattern that is not a code.
  int decode(uint32_t w, int& sym) const {
    const uint16_t e = fast[w >> (32 - kFast)];
    if (e) {
      sym = e & 0xFF;
      return e >> 8;
    }
    for (int l = kFast + 1; l <= 16; ++l) {
      const int32_t c = static_cast<int32_t>(w >> (32 - l));
      if (c <= maxcode[l]) {
        sym = vals[static_cast<size_t>(valoff[l] + c)];
        return l;
      }
    }
    return 0;
  }
};

// Tables for walking AC coefficients without their values, derived from a Huffman table:
// - skip, per 11-bit lookahead: (bits the code and its value take) | (its advance) << 8; for the
//   prefix of longer codes, 0x8000 | the first of 32 entries in skip2 for their last 5 bits;
// - pairs, two symbols per lookup: per 12-bit lookahead whose first symbol and its value fit in
//   it, (bits of the first) | (its advance) << 5 | (bits of both, or of the first when the second
//   does not fit) << 12 | (their advance) << 17; 0 when the first does not fit.
struct WalkTables {
  static constexpr int kSkip = 11, kPair = 12;
  std::array<uint8_t, 16> counts;  // the table they come from
  std::vector<uint8_t> vals;
  std::vector<uint16_t> skip, skip2;
  std::vector<uint32_t> pairs;

  explicit WalkTables(const Huffman& t);

  bool derivedFrom(const Huffman& t) const {
    return counts == t.counts && vals.size() == static_cast<size_t>(t.nsym) &&
           std::equal(vals.begin(), vals.end(), t.vals.begin());
  }
};

// Tables for decoding AC coefficients with their values (our decoder in place of libjpeg-turbo's,
// data/entropy_hook.h), derived from a Huffman table, per 11-bit lookahead (9 bits for DC tables):
//   - two symbols, each with a value of at most 5 bits, or the second the end of block, that fit
//     together: bit 31 | (bits both take) | (bits of the first) << 4 | (positions the first
//     advances: run + 1) << 8 | (the second's run + 1; 0 for end of block) << 13 | (the first
//     coefficient, 6-bit two's complement) << 18 | (the second) << 24;
//   - else a symbol and its value that fit: (bits both take) | (positions it advances: run + 1,
//     16 for ZRL, 64 for end of block) << 8 | (the coefficient, 15-bit two's complement; 0 for
//     ZRL and end of block) << 16;
//   - else a code that fits but whose value does not: 0x80 | (the code's bits) | (run + 1) << 8 |
//     (the value's bit count) << 16;
//   - 0 for a longer code (the caller decodes the symbol with Huffman::decode).
// About three quarters of the symbols of a photo at quality 90 take 6 bits or fewer with their
// values, so most look-ups of a block's first coefficients give two of them.
struct ValueTables {
  static constexpr int kBits = 11;   // AC tables' lookahead
  static constexpr int kDcBits = 9;  // DC tables': shorter codes, and a smaller table beside the AC ones
  int bits;                          // this table's lookahead
  std::array<uint8_t, 16> counts;    // the table they come from
  std::vector<uint8_t> vals;
  std::vector<int32_t> fast;

  // dc: for a DC table, whose symbols are value sizes (single entries, run + 1 = 1).
  explicit ValueTables(const Huffman& t, bool dc = false);

  bool derivedFrom(const Huffman& t) const {
    return counts == t.counts && vals.size() == static_cast<size_t>(t.nsym) &&
           std::equal(vals.begin(), vals.end(), t.vals.begin());
  }

  static int singleValue(int32_t e) { return static_cast<int32_t>(static_cast<uint32_t>(e) << 1) >> 17; }
  static int firstValue(int32_t e) { return static_cast<int32_t>(static_cast<uint32_t>(e) << 8) >> 26; }
  static int secondValue(int32_t e) { return static_cast<int32_t>(static_cast<uint32_t>(e) << 2) >> 26; }
};

struct DcValueTables : ValueTables {
  explicit DcValueTables(const Huffman& t) : ValueTables(t, true) {}
};

// t's value tables, derived once per thread as walkTables below.
const ValueTables& valueTables(const Huffman& t);
const DcValueTables& dcValueTables(const Huffman& t);

// Natural (row-major) position of each zigzag index.
inline constexpr uint8_t kNaturalOrder[64] = {0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
                                              12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
                                              35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
                                              58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

// t's walk tables, derived once per thread for each distinct table (most files of a dataset share
// a few, often the JPEG standard's). The reference stays valid until 8 other tables were looked up.
const WalkTables& walkTables(const Huffman& t);

// A scan component: sampling factors, blocks per MCU and its Huffman tables.
struct ScanComponent {
  int h = 1, v = 1;
  int blocks = 1;
  int dc_table = 0, ac_table = 0;
};

struct Headers {
  int width = 0, height = 0;
  int hmax = 1, vmax = 1;
  std::vector<ScanComponent> comps;  // in scan order
  size_t sof_at = 0, scan_at = 0;
  Huffman dc[4], ac[4];
};

// Parses the markers from SOI to the end of the first SOS. Returns false for anything this
// index does not handle (see data/jpeg_index.h) or malformed headers.
bool parseHeaders(const uint8_t* d, size_t size, Headers& h);

// Removes byte stuffing (FF 00 -> FF) from the entropy-coded data starting at file offset from,
// until a marker or until want bytes were produced. skipped (optional) receives, for each file
// byte dropped, the number of bytes produced before it. Returns the file offset where it stopped.
// out gets 256 zero bytes of padding past what was produced (not counted in *produced).
size_t unstuff(const uint8_t* d, size_t size, size_t from, size_t want, std::vector<uint8_t>& out, size_t* produced,
               std::vector<uint32_t>* skipped);

// The 32 bits at bit offset at of an unstuffed buffer (zero padding past the data).
inline uint32_t read32(const uint8_t* buf, uint64_t at) {
  return static_cast<uint32_t>((load64be(buf + (at >> 3)) << (at & 7)) >> 32);
}

inline int extend(uint32_t v, int s) {
  return v < (1u << (s - 1)) ? static_cast<int>(v) - (1 << s) + 1 : static_cast<int>(v);
}

// Walks blocks (the index build, each extract row's first MCU) in an unstuffed buffer from bit
// offset start: a 64-bit bit buffer refilled before every symbol (at least 56 bits after a
// refill; a symbol and its value take at most 31). The buffer needs zero padding past the data:
// 512 bytes where the data may be corrupt (a block may run on for 64 x 31 bits before the
// caller's check), 16 where an index build already walked it.
class FastWalker {
 public:
  FastWalker(const uint8_t* buf, uint64_t start) : base_(buf) {
    s_.p = buf + (start >> 3);
    s_.refill();
    s_.consume(static_cast<int>(start & 7));
  }
  uint64_t pos() const { return static_cast<uint64_t>(s_.p - base_) * 8 - static_cast<uint64_t>(s_.count); }

  bool dc(const Huffman& t, int& diff) {
    s_.refill();
    int s;
    const int len = t.decode(static_cast<uint32_t>(s_.bits >> 32), s);
    if (!len || s > 15) return false;
    s_.consume(len);
    diff = s ? extend(static_cast<uint32_t>(s_.bits >> (64 - s)), s) : 0;
    s_.consume(s);
    return true;
  }

  // dc with a DC table's value tables: most codes and their values in one look-up.
  bool dcValue(const DcValueTables& v, const Huffman& t, int& diff) {
    if (s_.count < 32) s_.refill();
    const int32_t e = v.fast[static_cast<size_t>(s_.bits >> (64 - ValueTables::kDcBits))];
    if (e & 0x80) {  // the code fits, its value does not
      const int sz = (e >> 16) & 15;
      s_.consume(e & 0x1F);
      diff = extend(static_cast<uint32_t>(s_.bits >> (64 - sz)), sz);
      s_.consume(sz);
      return true;
    }
    if (e) {
      s_.consume(e & 0xFF);
      diff = ValueTables::singleValue(e);
      return true;
    }
    return dc(t, diff);
  }

  // Decodes a block's AC coefficients into block (natural order, zeroed by the caller), as
  // libjpeg-turbo's decode_mcu does. False for data that is not a valid code, and for a
  // coefficient past the block's end (corrupt data libjpeg-turbo clamps; the caller then lets
  // libjpeg-turbo decode the file).
  bool acValues(const ValueTables& v, const Huffman& t, int16_t* block) {
    // The bit buffer in a local for the loop: as members, each symbol's decode waited for the
    // previous one's stores to come back from memory (the block stores may alias them).
    Bits b = s_;
    bool ok = true;
    for (int k = 1; k < 64;) {
      if (b.count < 32) b.refill();  // a symbol and its value take at most 31 bits
      const int32_t e = v.fast[static_cast<size_t>(b.bits >> (64 - ValueTables::kBits))];
      if (e < 0) {  // two symbols
        const int pos1 = k + ((e >> 8) & 31) - 1;
        const int a2 = (e >> 13) & 31;
        if (pos1 >= 63) {  // the first fills the block (or is past its end: corrupt)
          if (pos1 > 63) {
            ok = false;
            break;
          }
          block[63] = static_cast<int16_t>(ValueTables::firstValue(e));
          b.consume((e >> 4) & 15);
          break;
        }
        block[kNaturalOrder[pos1]] = static_cast<int16_t>(ValueTables::firstValue(e));
        b.consume(e & 15);
        if (!a2) break;  // end of block
        const int pos2 = pos1 + a2;
        if (pos2 > 63) {
          ok = false;
          break;
        }
        block[kNaturalOrder[pos2]] = static_cast<int16_t>(ValueTables::secondValue(e));
        k = pos2 + 1;
        continue;
      }
      if (e & 0x80) {  // the code fits, its value does not
        const int l = e & 0x1F, sz = (e >> 16) & 15;
        b.consume(l);
        const int pos = k + ((e >> 8) & 0xFF) - 1;
        if (pos > 63) {
          ok = false;
          break;
        }
        block[kNaturalOrder[pos]] = static_cast<int16_t>(extend(static_cast<uint32_t>(b.bits >> (64 - sz)), sz));
        b.consume(sz);
        k = pos + 1;
        continue;
      }
      if (e) {
        b.consume(e & 0xFF);
        const int pos = k + ((e >> 8) & 0xFF) - 1;
        const int value = ValueTables::singleValue(e);
        if (pos > 63) {
          ok = value == 0;  // end of block, or a zero run reaching the end; else corrupt
          break;
        }
        block[kNaturalOrder[pos]] = static_cast<int16_t>(value);
        k = pos + 1;
        continue;
      }
      int rs;
      const int len = t.decode(static_cast<uint32_t>(b.bits >> 32), rs);
      if (!len) {
        ok = false;
        break;
      }
      b.consume(len);
      const int r = rs >> 4, s = rs & 15;
      if (s) {
        k += r;
        if (k > 63) {
          ok = false;
          break;
        }
        block[kNaturalOrder[k]] = static_cast<int16_t>(extend(static_cast<uint32_t>(b.bits >> (64 - s)), s));
        b.consume(s);
        ++k;
      } else if (r == 15) {
        k += 16;
      } else {
        break;
      }
    }
    s_ = b;
    return ok;
  }

  // Skips a block's AC coefficients exactly as libjpeg-turbo's decode_mcu consumes them, up to
  // two symbols per lookup while the block goes on.
  bool ac(const WalkTables& t) {
    Bits b = s_;  // a local, as in acValues
    bool ok = true;
    for (int k = 1; k < 64;) {
      if (b.count < 32) b.refill();
      const uint32_t e2 = t.pairs[b.bits >> (64 - WalkTables::kPair)];
      if (e2) {
        const int a1 = (e2 >> 5) & 127;
        if (k + a1 >= 64) {  // the block ends with the first symbol: the next bits are not its
          b.consume(e2 & 31);
          break;
        }
        b.consume((e2 >> 12) & 31);
        k += static_cast<int>(e2 >> 17);
        continue;
      }
      uint16_t e = t.skip[static_cast<size_t>(b.bits >> (64 - WalkTables::kSkip))];
      if (__builtin_expect((e & 0x8000) != 0, 0))
        e = t.skip2[(e & 0x7FFF) | static_cast<size_t>((b.bits >> (64 - 16)) & 31)];
      if (__builtin_expect(!e, 0)) {  // not a code
        ok = false;
        break;
      }
      b.consume(e & 0xFF);
      k += e >> 8;
    }
    s_ = b;
    return ok;
  }

 private:
  struct Bits {
    uint64_t bits = 0;
    int count = 0;  // valid bits at the top of bits
    const uint8_t* p = nullptr;
    void refill() {
      bits |= load64be(p) >> count;
      p += (63 - count) >> 3;
      count |= 56;
    }
    void consume(int n) {
      bits <<= n;
      count -= n;
    }
  };
  const uint8_t* base_;
  Bits s_;
};

// Writes bits most significant first, stuffing a 00 after every FF byte.
class BitSink {
 public:
  explicit BitSink(uint8_t* out) : o_(out) {}
  void put(uint32_t v, int len) {  // len <= 32, v < 2^len
    acc_ = (acc_ << len) | v;      // n_ < 32 before: the pending bits stay in the low 64
    n_ += len;
    if (n_ >= 32) {
      n_ -= 32;
      emit32(static_cast<uint32_t>(acc_ >> n_));
    }
  }
  // Copies bits [from, to) of an unstuffed buffer (zero padding past the data).
  void copy(const uint8_t* src, uint64_t from, uint64_t to) {
    if (to - from >= 56) {
      while (n_ >= 8) {  // fewer than 8 pending bits, so 56 more fit in acc_
        n_ -= 8;
        emitByte(static_cast<uint8_t>(acc_ >> n_));
      }
      do {  // 7 bytes at a time
        acc_ = (acc_ << 56) | (load64be(src + (from >> 3)) << (from & 7)) >> 8;
        from += 56;
        const uint64_t w = acc_ >> n_;                  // its low 56 bits are the next 7 bytes
        const uint64_t x = ~w | 0xFF00000000000000ull;  // an FF byte in w is a zero byte in x
        if (((x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull) == 0) {
          const uint64_t be = __builtin_bswap64(w << 8);
          std::memcpy(o_, &be, 8);  // the 8th byte is overwritten next (the output has slack)
          o_ += 7;
        } else {
          for (int i = 6; i >= 0; --i) emitByte(static_cast<uint8_t>(w >> (8 * i)));
        }
      } while (to - from >= 56);
    }
    while (to - from >= 32) {
      put(read32(src, from), 32);
      from += 32;
    }
    const int rest = static_cast<int>(to - from);
    if (rest) put(read32(src, from) >> (32 - rest), rest);
  }
  // Pads with 1 bits to a byte boundary and writes what is left; returns the end pointer.
  uint8_t* finish() {
    const int pad = (8 - n_ % 8) % 8;
    if (pad) put((1u << pad) - 1, pad);
    while (n_ >= 8) {
      n_ -= 8;
      emitByte(static_cast<uint8_t>(acc_ >> n_));
    }
    return o_;
  }

 private:
  void emitByte(uint8_t b) {
    *o_++ = b;
    if (b == 0xFF) *o_++ = 0;
  }
  void emit32(uint32_t w) {
    const uint32_t x = ~w;  // an FF byte in w is a zero byte in x
    if (((x - 0x01010101u) & ~x & 0x80808080u) == 0) {
      const uint32_t be = __builtin_bswap32(w);
      std::memcpy(o_, &be, 4);
      o_ += 4;
    } else {
      for (int i = 3; i >= 0; --i) emitByte(static_cast<uint8_t>(w >> (8 * i)));
    }
  }
  uint8_t* o_;
  uint64_t acc_ = 0;
  int n_ = 0;  // bits in acc_ not yet written
};

}  // namespace aiacc::data::jpeg
