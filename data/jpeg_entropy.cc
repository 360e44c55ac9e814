#include "data/jpeg_entropy.h"

#include <memory>

namespace aiacc::data::jpeg {

bool Huffman::build(const uint8_t* bits, const uint8_t* symbols) {
  // Validated before anything is written: the counts must form a prefix code (Kraft: at most
  // 2^l codes of length <= l), else the fast table's fill below would run past its 512 entries.
  int n = 0;
  int64_t room = 1;  // codes still free at length l
  for (int l = 1; l <= 16; ++l) {
    room = 2 * room - bits[l - 1];
    if (room < 0) return false;  // over-subscribed: not a prefix code
    n += bits[l - 1];
  }
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
    c <<= 1;
  }
  maxcode[17] = 0x7fffffff;
  present = true;
  return true;
}

WalkTables::WalkTables(const Huffman& t)
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

ValueTables::ValueTables(const Huffman& t, bool dc)
    : bits(dc ? kDcBits : kBits), counts(t.counts), vals(t.vals.begin(), t.vals.begin() + t.nsym),
      fast(size_t{1} << bits, 0) {
  for (uint32_t v = 0; v < (1u << bits); ++v) {
    const uint32_t w = v << (32 - bits);
    int rs = 0;
    const int l = t.decode(w, rs);
    if (!l || l > bits) continue;  // (a longer code's length depends on bits past the lookahead)
    if (dc && rs > 15) continue;   // not a value size: the slow path rejects it
    const int r = dc ? 0 : rs >> 4, s = rs & 15;
    if (l + s > bits) {  // s > 0 here
      fast[v] = static_cast<int32_t>(0x80u | static_cast<uint32_t>(l) | static_cast<uint32_t>(r + 1) << 8 |
                                     static_cast<uint32_t>(s) << 16);
      continue;
    }
    int value = 0, advance;
    if (dc) {
      value = s ? extend((w << l) >> (32 - s), s) : 0;
      advance = 1;
    } else if (s) {
      value = extend((w << l) >> (32 - s), s);
      advance = r + 1;
    } else {
      advance = r == 15 ? 16 : 64;
    }
    fast[v] = static_cast<int32_t>((static_cast<uint32_t>(value) & 0x7FFF) << 16 | static_cast<uint32_t>(advance) << 8 |
                                   static_cast<uint32_t>(l + s));
    // A second symbol in the same look-up: both values small, or the second the end of block.
    const int n1 = l + s;
    if (dc || !s || s > 5) continue;
    int rs2 = 0;
    const int l2 = t.decode(w << n1, rs2);
    const int r2 = rs2 >> 4, s2 = rs2 & 15;
    if (!l2 || n1 + l2 + s2 > bits) continue;
    if (rs2 != 0 && (s2 == 0 || s2 > 5)) continue;  // ZRL and other zero-value symbols: one at a time
    const int value2 = s2 ? extend((w << (n1 + l2)) >> (32 - s2), s2) : 0;
    const uint32_t a2 = rs2 == 0 ? 0u : static_cast<uint32_t>(r2 + 1);
    fast[v] = static_cast<int32_t>(0x80000000u | static_cast<uint32_t>(n1 + l2 + s2) | static_cast<uint32_t>(n1) << 4 |
                                   static_cast<uint32_t>(r + 1) << 8 | a2 << 13 |
                                   (static_cast<uint32_t>(value) & 63) << 18 |
                                   (static_cast<uint32_t>(value2) & 63) << 24);
  }
}

namespace {

// Tables derived from Huffman tables, kept per thread for the last 8 distinct tables, least
// recently used first: a hit moves to the back, so the tables a decode uses (at most 4 of a kind)
// are never evicted while it runs.
template <typename Derived>
const Derived& derivedTables(const Huffman& t) {
  thread_local std::vector<std::unique_ptr<Derived>> derived;
  for (auto it = derived.begin(); it != derived.end(); ++it) {
    if ((*it)->derivedFrom(t)) {
      std::rotate(it, it + 1, derived.end());
      return *derived.back();
    }
  }
  if (derived.size() >= 8) derived.erase(derived.begin());
  derived.push_back(std::make_unique<Derived>(t));
  return *derived.back();
}

}  // namespace

const ValueTables& valueTables(const Huffman& t) { return derivedTables<ValueTables>(t); }
const DcValueTables& dcValueTables(const Huffman& t) { return derivedTables<DcValueTables>(t); }

const WalkTables& walkTables(const Huffman& t) { return derivedTables<WalkTables>(t); }

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
        ScanComponent c;
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

size_t unstuff(const uint8_t* d, size_t size, size_t from, size_t want, std::vector<uint8_t>& out, size_t* produced,
               std::vector<uint32_t>* skipped) {
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

}  // namespace aiacc::data::jpeg
