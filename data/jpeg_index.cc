#include "data/jpeg_index.h"

#include "data/decode_bounds.h"
#include "data/jpeg_entropy.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace aiacc::data {

using jpeg::BitSink;
using jpeg::FastWalker;
using jpeg::Headers;
using jpeg::Huffman;
using jpeg::ScanComponent;
using jpeg::WalkTables;

namespace {

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
         row_byte_.capacity() * sizeof(uint32_t) + comps_.capacity() * sizeof(ScanComponent);
}

bool JpegIndex::matches(const uint8_t* data, size_t size) const {
  return size == size_ && fingerprint(data, size, scan_at_) == fingerprint_;
}

std::unique_ptr<JpegIndexBuilder> JpegIndexBuilder::start(const uint8_t* data, size_t size, int cols_per_checkpoint) {
  std::unique_ptr<JpegIndexBuilder> b(new JpegIndexBuilder());
  Headers& h = b->h_;
  if (cols_per_checkpoint < 1 || !jpeg::parseHeaders(data, size, h)) return nullptr;
  b->data_ = data;
  b->size_ = size;
  b->ix_.reset(new JpegIndex());
  JpegIndex* ix = b->ix_.get();
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
  // A header that claims more blocks than the scan has bits (data/decode_bounds.h) belongs to a
  // truncated or crafted file, refused before the index's tables (about 10 bytes per checkpoint)
  // are sized from it.
  int mcu_blocks = 0;
  for (const auto& c : h.comps) mcu_blocks += c.blocks;
  const uint64_t blocks = static_cast<uint64_t>(ix->mcus_x_) * static_cast<uint64_t>(ix->mcus_y_) *
                          static_cast<uint64_t>(mcu_blocks);
  if (!jpegBlockRefusal(h.width, h.height, blocks, /*arith_code=*/false, size - h.scan_at).empty()) return nullptr;
  ix->k_ = b->k_ = cols_per_checkpoint;
  b->mcus_x_ = ix->mcus_x_;
  ix->per_row_ = (ix->mcus_x_ + ix->k_ - 1) / ix->k_;
  ix->size_ = size;
  ix->sof_at_ = h.sof_at;
  ix->scan_at_ = h.scan_at;
  const size_t entries = static_cast<size_t>(ix->mcus_y_) * ix->per_row_ + 1;
  ix->bit_.resize(entries);
  ix->dc_.resize(entries * static_cast<size_t>(ix->ncomp_));
  ix->row_byte_.resize(static_cast<size_t>(ix->mcus_y_));
  return b;
}

JpegIndexBuilder::~JpegIndexBuilder() = default;

int JpegIndexBuilder::mcusPerRow() const { return ix_->mcus_x_; }
size_t JpegIndexBuilder::scanAt() const { return h_.scan_at; }

bool JpegIndexBuilder::checkpoint(uint64_t pos, const int* pred) {
  JpegIndex& ix = *ix_;
  if (pos > 0xFFFFFFFFull || e_ >= ix.bit_.size()) return false;
  ix.bit_[e_] = static_cast<uint32_t>(pos);
  for (int c = 0; c < ix.ncomp_; ++c) {
    if (pred[c] < -32768 || pred[c] > 32767) return false;
    ix.dc_[e_ * static_cast<size_t>(ix.ncomp_) + static_cast<size_t>(c)] = static_cast<int16_t>(pred[c]);
  }
  ++e_;
  return true;
}

bool JpegIndexBuilder::mcuSlow(uint64_t pos, const int* pred, const std::vector<uint32_t>& skipped) {
  JpegIndex& ix = *ix_;
  const int r = row_, x = col_;
  if (++col_ == ix.mcus_x_) {
    col_ = 0;
    ++row_;
  }
  if (r >= ix.mcus_y_) return false;
  if (x == 0) {
    const size_t ubyte = static_cast<size_t>(pos >> 3);
    const size_t dropped = static_cast<size_t>(std::upper_bound(skipped.begin(), skipped.end(), ubyte) -
                                               skipped.begin());
    ix.row_byte_[static_cast<size_t>(r)] = static_cast<uint32_t>(h_.scan_at + ubyte + dropped);
  }
  return x % ix.k_ != 0 || checkpoint(pos, pred);
}

std::unique_ptr<JpegIndex> JpegIndexBuilder::finish(const uint8_t* buf, uint64_t nbits, uint64_t pos, int* pred,
                                                    const std::vector<uint32_t>& skipped, size_t stop) {
  JpegIndex& ix = *ix_;
  // The scan must end with the image: EOI next (a second scan or a DNL marker: not indexed).
  if (stop + 1 >= size_ || data_[stop] != 0xFF || data_[stop + 1] != 0xD9) return nullptr;
  const WalkTables* walk[4] = {nullptr, nullptr, nullptr, nullptr};
  for (const ScanComponent& c : ix.comps_) walk[c.ac_table] = &jpeg::walkTables(h_.ac[c.ac_table]);
  FastWalker src(buf, pos);
  while (row_ < ix.mcus_y_) {
    if (!mcu(src.pos(), pred, skipped)) return nullptr;
    for (int c = 0; c < ix.ncomp_; ++c) {
      const ScanComponent& comp = ix.comps_[static_cast<size_t>(c)];
      for (int b = 0; b < comp.blocks; ++b) {
        int diff;
        if (!src.dc(h_.dc[comp.dc_table], diff) || !src.ac(*walk[comp.ac_table])) return nullptr;
        pred[c] += diff;
        if (src.pos() > nbits) return nullptr;  // ran past the data: corrupt or truncated
      }
    }
  }
  if (!checkpoint(src.pos(), pred) || e_ != ix.bit_.size()) return nullptr;
  ix.fingerprint_ = fingerprint(data_, size_, h_.scan_at);
  return std::move(ix_);
}

std::unique_ptr<JpegIndex> JpegIndex::build(const uint8_t* data, size_t size, int cols_per_checkpoint) {
  std::unique_ptr<JpegIndexBuilder> b = JpegIndexBuilder::start(data, size, cols_per_checkpoint);
  if (!b) return nullptr;
  thread_local std::vector<uint8_t> buf;
  thread_local std::vector<uint32_t> skipped;
  skipped.clear();
  size_t produced = 0;
  const size_t stop = jpeg::unstuff(data, size, b->scanAt(), size, buf, &produced, &skipped);
  buf.resize(buf.size() + 256);  // FastWalker's padding: unstuff left 256
  int pred[4] = {0, 0, 0, 0};
  return b->finish(buf.data(), static_cast<uint64_t>(produced) * 8, 0, pred, skipped, stop);
}

bool JpegIndex::extract(const uint8_t* data, size_t size, int r0, int r1, int c0, int c1,
                        std::vector<uint8_t>& out) const {
  if (r0 < 0 || r1 > mcus_y_ || r0 >= r1 || c0 < 0 || c1 > mcus_x_ || c0 >= c1 || c0 % k_ ||
      (c1 % k_ && c1 != mcus_x_) || !matches(data, size)) {
    return false;
  }
  Headers h;
  if (!jpeg::parseHeaders(data, size, h)) return false;

  // Entropy-coded bytes of rows [r0, r1), unstuffed.
  const uint64_t base = static_cast<uint64_t>(bit_[entry(r0, 0)] >> 3) * 8;
  const uint64_t last = bit_[entry(r1 - 1, c1)];
  thread_local std::vector<uint8_t> buf;  // reused: no allocation or zero fill per extract
  size_t produced = 0;
  jpeg::unstuff(data, size, row_byte_[static_cast<size_t>(r0)], static_cast<size_t>((last - base) / 8 + 8), buf,
                &produced, nullptr);
  if (static_cast<uint64_t>(produced) * 8 < last - base) return false;

  // Headers: everything up to the scan but the application segments other than JFIF (APP0) and
  // Adobe (APP14, which says whether the data is YCbCr) and comments; the frame's size patched.
  // Worst case: every byte stuffed, and each row's re-encoded DC codes longer than the originals.
  out.resize(scan_at_ + 2 * static_cast<size_t>((last - bit_[entry(r0, c0)]) / 8) + 32 * static_cast<size_t>(r1 - r0) +
             64);
  uint8_t* o = out.data();
  *o++ = 0xFF;
  *o++ = 0xD8;
  const int w = std::min(c1 * mcu_w_, width_) - c0 * mcu_w_;
  const int hgt = std::min(r1 * mcu_h_, height_) - r0 * mcu_h_;
  for (size_t p = 2; p < scan_at_;) {
    while (data[p + 1] == 0xFF) ++p;
    const uint8_t m = data[p + 1];
    const size_t len = jpeg::be16(data + p + 2);
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
  for (const ScanComponent& c : comps_) walk[c.ac_table] = &jpeg::walkTables(h.ac[c.ac_table]);
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
      const ScanComponent& comp = comps_[static_cast<size_t>(c)];
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
    : slots_(new std::atomic<const JpegIndex*>[files]), state_(new std::atomic<uint8_t>[files]), files_(files),
      budget_(budget_bytes), k_(cols_per_checkpoint) {
  for (size_t i = 0; i < files; ++i) {
    slots_[i].store(nullptr);
    state_[i].store(kUnknown);
  }
}

JpegIndexCache::~JpegIndexCache() {
  for (size_t i = 0; i < files_; ++i) delete slots_[i].load();
}

const JpegIndex* JpegIndexCache::find(size_t i, bool* wanted) const {
  *wanted = false;
  if (i >= files_) return nullptr;
  if (const JpegIndex* ix = slots_[i].load(std::memory_order_acquire)) return ix;
  *wanted = state_[i].load() != kRefused && bytes_.load() < budget_;
  return nullptr;
}

const JpegIndex* JpegIndexCache::offer(size_t i, std::unique_ptr<JpegIndex> built) {
  if (i >= files_) return nullptr;
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

const JpegIndex* JpegIndexCache::get(size_t i, const uint8_t* data, size_t size) {
  bool wanted;
  if (const JpegIndex* ix = find(i, &wanted)) return ix;
  return wanted ? offer(i, JpegIndex::build(data, size, k_)) : nullptr;
}

}  // namespace aiacc::data
