#include "data/jpeg_index.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace aiacc::data {
namespace {

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

uint64_t load64be(const uint8_t* p) {
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
  std::array<uint8_t, 256> size{};          // 0: the symbol has no code
  std::array<uint8_t, 16> counts{};  // the DHT's code counts per length (with vals: the table)
  int nsym = 0;

  bool build(const uint8_t* bits /* [16]: codes of length 1..16 */, const uint8_t* symbols) {
    int n = 0;
    for (int l = 1; l <= 16; ++l) n += bits[l - 1];
    if (n > 256) return false;
    std::copy(bits, bits + 16, counts.begin());
    nsym = n;
    std::copy(symbols, symbols + n, vals.begin());
    fast.fill(0);
    size.fill(0);
    int32_t c = 0;
    int k = 0;
    for (int l = 1; l <= 16; ++l) {
      valoff[l] = k - c;
      for (int i = 0; i < bits[l - 1]; ++i, ++k, ++c) {
        const uint8_t sym = vals[k];
        code[sym] = static_cast<uint16_t>(c);
        size[sym] = static_cast<uint8_t>(l);
        if (l <= kFast) {
          const int shift = kFast - l;
          for (int j = 0; j < (1 << shift); ++j) fast[(c << shift) | j] = static_cast<uint16_t>(l << 8 | sym);
        }
      }
      maxcode[l] = bits[l - 1] ? c - 1 : -1;
      if (c > (1 << l)) return false;  // over-subscribed: not a prefix code
      c <<= 1;
    }
    maxcode[17] = 0x7fffffff;
    present = true;
    return true;
  }

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

  explicit WalkTables(const Huffman& t)
      : counts(t.counts), vals(t.vals.begin(), t.vals.begin() + t.nsym), skip(1 << kSkip, 0), pairs(1 << kPair, 0) {
    for (int sym = 0; sym < 256; ++sym) {
      const int l = t.size[static_cast<size_t>(sym)];
      if (!l) continue;
      const uint32_t c = t.code[static_cast<size_t>(sym)];
      const uint16_t e = static_cast<uint16_t>((l + (sym & 15)) | Huffman::advance(sym) << 8);
      if (l <= kSkip) {
        const int shift = kSkip - l;
        for (int j = 0; j < (1 << shift); ++j) skip[(c << shift) | static_cast<uint32_t>(j)] = e;
        continue;
      }
      const uint32_t prefix = c >> (l - kSkip);  // a code's first 11 bits
      if (!(skip[prefix] & 0x8000)) {
        skip[prefix] = static_cast<uint16_t>(0x8000 | skip2.size());
        skip2.resize(skip2.size() + 32, 0);
      }
      uint16_t* sub = &skip2[skip[prefix] & 0x7FFF];
      const int shift = 16 - l;
      const uint32_t low = (c << shift) & 31;  // the code's bits 12..l, then free bits
      for (int j = 0; j < (1 << shift); ++j) sub[low | static_cast<uint32_t>(j)] = e;
    }
    for (uint32_t v = 0; v < (1u << kPair); ++v) {
      const uint32_t w = v << (32 - kPair);
      int rs1;
      const int l1 = t.decode(w, rs1);
      const int n1 = l1 + (rs1 & 15);
      if (!l1 || n1 > kPair) continue;
      const int a1 = Huffman::advance(rs1);
      int n = n1, a = a1;
      if (a1 < 64) {
        int rs2;
        const int l2 = t.decode(w << n1, rs2);
        if (l2 && n1 + l2 + (rs2 & 15) <= kPair) {
          n = n1 + l2 + (rs2 & 15);
          a = a1 + Huffman::advance(rs2);
        }
      }
      pairs[v] = static_cast<uint32_t>(n1) | static_cast<uint32_t>(a1) << 5 | static_cast<uint32_t>(n) << 12 |
                 static_cast<uint32_t>(a) << 17;
    }
  }

  bool derivedFrom(const Huffman& t) const {
    return counts == t.counts && vals.size() == static_cast<size_t>(t.nsym) &&
           std::equal(vals.begin(), vals.end(), t.vals.begin());
  }
};

// t's walk tables, derived once per thread for each distinct table (most files of a dataset share
// a few, often the JPEG standard's). The reference stays valid until 8 other tables were derived.
const WalkTables& walkTables(const Huffman& t) {
  thread_local std::vector<std::unique_ptr<WalkTables>> derived;
  for (const auto& d : derived) {
    if (d->derivedFrom(t)) return *d;
  }
  if (derived.size() >= 8) derived.erase(derived.begin());
  derived.push_back(std::make_unique<WalkTables>(t));
  return *derived.back();
}

struct Headers {
  int width = 0, height = 0;
  int hmax = 1, vmax = 1;
  std::vector<JpegIndex::Component> comps;  // in scan order
  size_t sof_at = 0, scan_at = 0;
  Huffman dc[4], ac[4];
};

// Parses the markers from SOI to the end of the first SOS. Returns false for anything this
// index does not handle (see the header) or malformed headers.
bool parseHeaders(const uint8_t* d, size_t size, Headers& h) {
  if (size < 4 || d[0] != 0xFF || d[1] != 0xD8) return false;
  struct FrameComp {
    int id, h, v;
  };
  std::vector<FrameComp> frame;
  bool sof = false;
  size_t p = 2;
  for (;;) {
    while (p + 1 < size && d[p] == 0xFF && d[p + 1] == 0xFF) ++p;  // fill bytes
    if (p + 4 > size || d[p] != 0xFF) return false;
    const uint8_t m = d[p + 1];
    const size_t len = be16(d + p + 2);
    if (len < 2 || p + 2 + len > size) return false;
    const uint8_t* s = d + p + 4;  // segment body
    const size_t n = len - 2;
    if (m == 0xC0 || m == 0xC1) {  // baseline / extended sequential, Huffman
      if (n < 6 || s[0] != 8) return false;
      h.height = be16(s + 1);
      h.width = be16(s + 3);
      const int nf = s[5];
      if (nf < 1 || nf > 4 || n < 6 + 3 * static_cast<size_t>(nf) || h.width == 0 || h.height == 0) return false;
      for (int i = 0; i < nf; ++i) {
        const uint8_t* c = s + 6 + 3 * i;
        frame.push_back({c[0], c[1] >> 4, c[1] & 15});
        if (frame.back().h < 1 || frame.back().h > 4 || frame.back().v < 1 || frame.back().v > 4) return false;
      }
      h.sof_at = p;
      sof = true;
    } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4) {
      return false;  // progressive, lossless, hierarchical or arithmetic coding
    } else if (m == 0xC4) {
      size_t q = 0;
      while (q < n) {
        if (q + 17 > n) return false;
        const int cls = s[q] >> 4, id = s[q] & 15;
        if (cls > 1 || id > 3) return false;
        int count = 0;
        for (int l = 0; l < 16; ++l) count += s[q + 1 + l];
        if (q + 17 + static_cast<size_t>(count) > n) return false;
        Huffman& t = cls == 0 ? h.dc[id] : h.ac[id];
        if (!t.build(s + q + 1, s + q + 17)) return false;
        q += 17 + static_cast<size_t>(count);
      }
    } else if (m == 0xDD) {
      if (n < 2 || be16(s) != 0) return false;  // restart markers reset the predictors mid-row
    } else if (m == 0xDA) {
      if (!sof || n < 1) return false;
      const int ns = s[0];
      if (ns != static_cast<int>(frame.size()) || n < 1 + 2 * static_cast<size_t>(ns) + 3) return false;
      for (int i = 0; i < ns; ++i) {
        const int id = s[1 + 2 * i], tables = s[2 + 2 * i];
        auto f = std::find_if(frame.begin(), frame.end(), [&](const FrameComp& c) { return c.id == id; });
        if (f == frame.end()) return false;
        JpegIndex::Component c;
        c.h = f->h;
        c.v = f->v;
        c.blocks = ns == 1 ? 1 : c.h * c.v;
        c.dc_table = tables >> 4;
        c.ac_table = tables & 15;
        if (c.dc_table > 3 || c.ac_table > 3 || !h.dc[c.dc_table].present || !h.ac[c.ac_table].present) return false;
        h.comps.push_back(c);
      }
      const uint8_t* t = s + 1 + 2 * ns;
      if (t[0] != 0 || t[1] != 63 || t[2] != 0) return false;  // not a sequential scan
      for (const FrameComp& f : frame) {
        h.hmax = std::max(h.hmax, f.h);
        h.vmax = std::max(h.vmax, f.v);
      }
      int mcu_blocks = 0;
      for (const auto& c : h.comps) mcu_blocks += c.blocks;
      if (mcu_blocks > 10) return false;
      h.scan_at = p + 2 + len;
      return true;
    } else if (m == 0xD8 || m == 0xD9 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) {
      return false;
    }
    p += 2 + len;
  }
}

// Removes byte stuffing (FF 00 -> FF) from the entropy-coded data starting at file offset from,
// until a marker or until want bytes were produced. skipped (optional) receives, for each file
// byte dropped, the number of bytes produced before it. Returns the file offset where it stopped.
// out gets 256 zero bytes of padding past what was produced (not counted in *produced).
size_t unstuff(const uint8_t* d, size_t size, size_t from, size_t want, std::vector<uint8_t>& out,
               size_t* produced, std::vector<uint32_t>* skipped) {
  if (out.size() < std::min(want, size - from) + 256) out.resize(std::min(want, size - from) + 256);
  uint8_t* o = out.data();
  size_t n = 0, p = from;
  while (p < size && n < want) {
    const void* ff = std::memchr(d + p, 0xFF, size - p);
    size_t run = ff ? static_cast<size_t>(static_cast<const uint8_t*>(ff) - (d + p)) : size - p;
    run = std::min(run, want - n);
    std::memcpy(o + n, d + p, run);
    n += run;
    p += run;
    if (n >= want || p >= size || d[p] != 0xFF) break;
    if (p + 1 >= size) break;
    const uint8_t next = d[p + 1];
    if (next == 0x00) {
      o[n++] = 0xFF;
      if (skipped) skipped->push_back(static_cast<uint32_t>(n));
      p += 2;
    } else if (next == 0xFF) {
      if (skipped) skipped->push_back(static_cast<uint32_t>(n));
      p += 1;  // a fill byte
    } else {
      break;  // a marker ends the scan
    }
  }
  std::memset(o + n, 0, 256);
  out.resize(n + 256);
  *produced = n;
  return p;
}

// The 32 bits at bit offset at of an unstuffed buffer (zero padding past the data).
uint32_t read32(const uint8_t* buf, uint64_t at) {
  return static_cast<uint32_t>((load64be(buf + (at >> 3)) << (at & 7)) >> 32);
}

int extend(uint32_t v, int s) { return v < (1u << (s - 1)) ? static_cast<int>(v) - (1 << s) + 1 : static_cast<int>(v); }

// Walks blocks (the index build, each extract row's first MCU) in an unstuffed buffer from bit
// offset start: a 64-bit bit buffer refilled before every symbol (at least 56 bits after a
// refill; a symbol and its value take at most 31). The buffer needs zero padding past the data:
// 512 bytes where the data may be corrupt (a block may run on for 64 x 31 bits before the
// caller's check), 16 where an index build already walked it.
class FastWalker {
 public:
  FastWalker(const uint8_t* buf, uint64_t start) : base_(buf), p_(buf + (start >> 3)) {
    refill();
    consume(static_cast<int>(start & 7));
  }
  uint64_t pos() const { return static_cast<uint64_t>(p_ - base_) * 8 - static_cast<uint64_t>(count_); }

  bool dc(const Huffman& t, int& diff) {
    refill();
    int s;
    const int len = t.decode(static_cast<uint32_t>(bits_ >> 32), s);
    if (!len || s > 15) return false;
    consume(len);
    diff = s ? extend(static_cast<uint32_t>(bits_ >> (64 - s)), s) : 0;
    consume(s);
    return true;
  }

  // Skips a block's AC coefficients exactly as libjpeg-turbo's decode_mcu consumes them, up to
  // two symbols per lookup while the block goes on.
  bool ac(const WalkTables& t) {
    for (int k = 1; k < 64;) {
      refill();
      const uint32_t p = t.pairs[bits_ >> (64 - WalkTables::kPair)];
      if (p) {
        const int a1 = (p >> 5) & 127;
        if (k + a1 >= 64) {  // the block ends with the first symbol: the next bits are not its
          consume(p & 31);
          break;
        }
        consume((p >> 12) & 31);
        k += static_cast<int>(p >> 17);
        continue;
      }
      uint16_t e = t.skip[static_cast<size_t>(bits_ >> (64 - WalkTables::kSkip))];
      if (__builtin_expect((e & 0x8000) != 0, 0)) e = t.skip2[(e & 0x7FFF) | static_cast<size_t>((bits_ >> (64 - 16)) & 31)];
      if (__builtin_expect(!e, 0)) return false;  // not a code
      consume(e & 0xFF);
      k += e >> 8;
    }
    return true;
  }

 private:
  void refill() {
    bits_ |= load64be(p_) >> count_;
    p_ += (63 - count_) >> 3;
    count_ |= 56;
  }
  void consume(int n) {
    bits_ <<= n;
    count_ -= n;
  }
  const uint8_t* base_;
  const uint8_t* p_;
  uint64_t bits_ = 0;
  int count_ = 0;  // valid bits at the top of bits_
};

// Writes bits most significant first, stuffing a 00 after every FF byte.
class BitSink {
 public:
  explicit BitSink(uint8_t* out) : o_(out) {}
  void put(uint32_t v, int len) {  // len <= 32, v < 2^len
    acc_ = (acc_ << len) | v;  // n_ < 32 before: the pending bits stay in the low 64
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
        const uint64_t w = acc_ >> n_;  // its low 56 bits are the next 7 bytes
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

uint64_t fnv1a(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A hash of the file's first bytes, of the last bytes before its scan (the tables and the frame)
// and of its last bytes: checked on every decode, so bounded (EXIF and ICC segments can make the
// headers tens of KB).
uint64_t fingerprint(const uint8_t* d, size_t size, size_t scan_at) {
  scan_at = std::min(scan_at, size);
  const size_t head = std::min<size_t>(scan_at, 256);
  const size_t tables = std::min<size_t>(scan_at - head, 768);
  const size_t tail = std::min<size_t>(size - scan_at, 64);
  uint64_t h = fnv1a(0xcbf29ce484222325ull, d, head);
  h = fnv1a(h, d + scan_at - tables, tables);
  return fnv1a(h, d + size - tail, tail);
}

}  // namespace

size_t JpegIndex::entry(int r, int c) const {
  if (c >= mcus_x_) return static_cast<size_t>(r + 1) * per_row_;  // row r+1's start, or the end entry
  return static_cast<size_t>(r) * per_row_ + static_cast<size_t>(c / k_);
}

size_t JpegIndex::bytes() const {
  return sizeof(*this) + bit_.capacity() * sizeof(uint32_t) + dc_.capacity() * sizeof(int16_t) +
         row_byte_.capacity() * sizeof(uint32_t) + comps_.capacity() * sizeof(Component);
}

bool JpegIndex::matches(const uint8_t* data, size_t size) const {
  return size == size_ && fingerprint(data, size, scan_at_) == fingerprint_;
}

std::unique_ptr<JpegIndex> JpegIndex::build(const uint8_t* data, size_t size, int cols_per_checkpoint) {
  Headers h;
  if (cols_per_checkpoint < 1 || !parseHeaders(data, size, h)) return nullptr;
  std::unique_ptr<JpegIndex> ix(new JpegIndex());
  ix->width_ = h.width;
  ix->height_ = h.height;
  ix->ncomp_ = static_cast<int>(h.comps.size());
  ix->comps_ = h.comps;
  ix->mcu_w_ = ix->ncomp_ == 1 ? 8 : 8 * h.hmax;
  ix->mcu_h_ = ix->ncomp_ == 1 ? 8 : 8 * h.vmax;
  if (ix->ncomp_ == 1) {
    // A single-component scan has one block per MCU over the component's own grid.
    const auto& c = h.comps[0];
    ix->mcus_x_ = (((h.width * c.h + h.hmax - 1) / h.hmax) + 7) / 8;
    ix->mcus_y_ = (((h.height * c.v + h.vmax - 1) / h.vmax) + 7) / 8;
    if (c.h != h.hmax || c.v != h.vmax) return nullptr;  // unusual; not worth the cases
  } else {
    ix->mcus_x_ = (h.width + ix->mcu_w_ - 1) / ix->mcu_w_;
    ix->mcus_y_ = (h.height + ix->mcu_h_ - 1) / ix->mcu_h_;
  }
  ix->k_ = cols_per_checkpoint;
  ix->per_row_ = (ix->mcus_x_ + ix->k_ - 1) / ix->k_;
  ix->size_ = size;
  ix->sof_at_ = h.sof_at;
  ix->scan_at_ = h.scan_at;

  std::vector<uint8_t> buf;
  std::vector<uint32_t> skipped;
  size_t produced = 0;
  const size_t stop = unstuff(data, size, h.scan_at, size, buf, &produced, &skipped);
  // The scan must end with the image: EOI next (a second scan or a DNL marker: not indexed).
  if (stop + 1 >= size || data[stop] != 0xFF || data[stop + 1] != 0xD9) return nullptr;
  const uint64_t nbits = static_cast<uint64_t>(produced) * 8;

  const size_t entries = static_cast<size_t>(ix->mcus_y_) * ix->per_row_ + 1;
  ix->bit_.resize(entries);
  ix->dc_.resize(entries * static_cast<size_t>(ix->ncomp_));
  ix->row_byte_.resize(static_cast<size_t>(ix->mcus_y_));
  const WalkTables* walk[4] = {nullptr, nullptr, nullptr, nullptr};
  for (const Component& c : ix->comps_) walk[c.ac_table] = &walkTables(h.ac[c.ac_table]);
  buf.resize(buf.size() + 256);  // FastWalker's padding: unstuff left 256
  FastWalker src(buf.data(), 0);
  int pred[4] = {0, 0, 0, 0};
  size_t e = 0;
  auto checkpoint = [&] {
    if (src.pos() > 0xFFFFFFFFull) return false;
    ix->bit_[e] = static_cast<uint32_t>(src.pos());
    for (int c = 0; c < ix->ncomp_; ++c) {
      if (pred[c] < -32768 || pred[c] > 32767) return false;
      ix->dc_[e * static_cast<size_t>(ix->ncomp_) + static_cast<size_t>(c)] = static_cast<int16_t>(pred[c]);
    }
    ++e;
    return true;
  };
  for (int r = 0; r < ix->mcus_y_; ++r) {
    const size_t ubyte = src.pos() >> 3;
    const size_t dropped = static_cast<size_t>(std::upper_bound(skipped.begin(), skipped.end(), ubyte) - skipped.begin());
    ix->row_byte_[static_cast<size_t>(r)] = static_cast<uint32_t>(h.scan_at + ubyte + dropped);
    for (int x = 0; x < ix->mcus_x_; ++x) {
      if (x % ix->k_ == 0 && !checkpoint()) return nullptr;
      for (int c = 0; c < ix->ncomp_; ++c) {
        const Component& comp = ix->comps_[static_cast<size_t>(c)];
        for (int b = 0; b < comp.blocks; ++b) {
          int diff;
          if (!src.dc(h.dc[comp.dc_table], diff) || !src.ac(*walk[comp.ac_table])) return nullptr;
          pred[c] += diff;
          if (src.pos() > nbits) return nullptr;  // ran past the data: corrupt or truncated
        }
      }
    }
  }
  if (!checkpoint()) return nullptr;
  ix->fingerprint_ = fingerprint(data, size, h.scan_at);
  return ix;
}

bool JpegIndex::extract(const uint8_t* data, size_t size, int r0, int r1, int c0, int c1,
                        std::vector<uint8_t>& out) const {
  if (r0 < 0 || r1 > mcus_y_ || r0 >= r1 || c0 < 0 || c1 > mcus_x_ || c0 >= c1 || c0 % k_ ||
      (c1 % k_ && c1 != mcus_x_) || !matches(data, size)) {
    return false;
  }
  Headers h;
  if (!parseHeaders(data, size, h)) return false;

  // Entropy-coded bytes of rows [r0, r1), unstuffed.
  const uint64_t base = static_cast<uint64_t>(bit_[entry(r0, 0)] >> 3) * 8;
  const uint64_t last = bit_[entry(r1 - 1, c1)];
  thread_local std::vector<uint8_t> buf;  // reused: no allocation or zero fill per extract
  size_t produced = 0;
  unstuff(data, size, row_byte_[static_cast<size_t>(r0)], static_cast<size_t>((last - base) / 8 + 8), buf,
          &produced, nullptr);
  if (static_cast<uint64_t>(produced) * 8 < last - base) return false;

  // Headers: everything up to the scan but the application segments other than JFIF (APP0) and
  // Adobe (APP14, which says whether the data is YCbCr) and comments; the frame's size patched.
  // Worst case: every byte stuffed, and each row's re-encoded DC codes longer than the originals.
  out.resize(scan_at_ + 2 * static_cast<size_t>((last - bit_[entry(r0, c0)]) / 8) + 32 * static_cast<size_t>(r1 - r0) + 64);
  uint8_t* o = out.data();
  *o++ = 0xFF;
  *o++ = 0xD8;
  const int w = std::min(c1 * mcu_w_, width_) - c0 * mcu_w_;
  const int hgt = std::min(r1 * mcu_h_, height_) - r0 * mcu_h_;
  for (size_t p = 2; p < scan_at_;) {
    while (data[p + 1] == 0xFF) ++p;
    const uint8_t m = data[p + 1];
    const size_t len = be16(data + p + 2);
    const bool drop = (m >= 0xE1 && m <= 0xED) || m == 0xEF || m == 0xFE;
    if (!drop) {
      std::memcpy(o, data + p, 2 + len);
      if (p == sof_at_) {
        o[5] = static_cast<uint8_t>(hgt >> 8);
        o[6] = static_cast<uint8_t>(hgt & 0xFF);
        o[7] = static_cast<uint8_t>(w >> 8);
        o[8] = static_cast<uint8_t>(w & 0xFF);
      }
      o += 2 + len;
    }
    p += 2 + len;
  }

  const WalkTables* walk[4] = {nullptr, nullptr, nullptr, nullptr};
  for (const Component& c : comps_) walk[c.ac_table] = &walkTables(h.ac[c.ac_table]);
  BitSink sink(o);
  int pred[4] = {0, 0, 0, 0};  // the extract's predictors
  for (int r = r0; r < r1; ++r) {
    const size_t eb = entry(r, c0), ee = entry(r, c1);
    const int16_t* before = &dc_[eb * static_cast<size_t>(ncomp_)];
    const int16_t* after = &dc_[ee * static_cast<size_t>(ncomp_)];
    const uint64_t end = bit_[ee] - base;
    FastWalker src(buf.data(), bit_[eb] - base);
    uint64_t copied = src.pos();
    // The first MCU: each component's first DC difference is re-encoded against the extract's
    // predictor; everything else is copied bit for bit.
    for (int c = 0; c < ncomp_; ++c) {
      const Component& comp = comps_[static_cast<size_t>(c)];
      const Huffman& dct = h.dc[comp.dc_table];
      for (int b = 0; b < comp.blocks; ++b) {
        const uint64_t dc_at = src.pos();
        int diff;
        if (!src.dc(dct, diff)) return false;
        if (b == 0) {
          const int nd = before[c] + diff - pred[c];
          const int mag = nd < 0 ? -nd : nd;
          const int cat = mag ? 32 - __builtin_clz(static_cast<unsigned>(mag)) : 0;
          if (cat > 15 || !dct.size[cat]) return false;
          sink.copy(buf.data(), copied, dc_at);
          sink.put(dct.code[cat], dct.size[cat]);
          if (cat) sink.put(static_cast<uint32_t>(nd < 0 ? nd + (1 << cat) - 1 : nd) & ((1u << cat) - 1), cat);
          copied = src.pos();
        }
        if (!src.ac(*walk[comp.ac_table])) return false;
      }
    }
    if (src.pos() > end) return false;
    sink.copy(buf.data(), copied, end);
    for (int c = 0; c < ncomp_; ++c) pred[c] = after[c];
  }
  o = sink.finish();
  *o++ = 0xFF;
  *o++ = 0xD9;
  const size_t end = static_cast<size_t>(o - out.data());
  out.resize(end + kTailPadding);
  std::memset(out.data() + end, 0, kTailPadding);
  return true;
}

JpegIndexCache::JpegIndexCache(size_t files, size_t budget_bytes, int cols_per_checkpoint)
    : slots_(new std::atomic<const JpegIndex*>[files]), state_(new std::atomic<uint8_t>[files]),
      files_(files), budget_(budget_bytes), k_(cols_per_checkpoint) {
  for (size_t i = 0; i < files; ++i) {
    slots_[i].store(nullptr);
    state_[i].store(kUnknown);
  }
}

JpegIndexCache::~JpegIndexCache() {
  for (size_t i = 0; i < files_; ++i) delete slots_[i].load();
}

const JpegIndex* JpegIndexCache::get(size_t i, const uint8_t* data, size_t size) {
  if (i >= files_) return nullptr;
  if (const JpegIndex* ix = slots_[i].load(std::memory_order_acquire)) return ix;
  if (state_[i].load() == kRefused || bytes_.load() >= budget_) return nullptr;
  std::unique_ptr<JpegIndex> built = JpegIndex::build(data, size, k_);
  if (!built) {
    if (state_[i].exchange(kRefused) == kUnknown) refused_.fetch_add(1);
    return nullptr;
  }
  const JpegIndex* expected = nullptr;
  if (!slots_[i].compare_exchange_strong(expected, built.get(), std::memory_order_acq_rel)) {
    return expected;  // another thread indexed it first
  }
  state_[i].store(kIndexed);
  bytes_.fetch_add(built->bytes());
  indexed_.fetch_add(1);
  return built.release();
}

}  // namespace aiacc::data
