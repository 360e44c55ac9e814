#include "data/entropy_hook.h"

#include "data/entropy_gate.h"
#include "data/jpeg_index.h"

#include <cstdio>  // jpeglib.h needs FILE
#include <jpeglib.h>

#include <algorithm>
#include <atomic>
#include <memory>

namespace aiacc::data {
namespace {

// libjpeg 7+ ABIs (libjpeg-turbo built WITH_JPEG7/8) name the scaled sizes per direction.
#if JPEG_LIB_VERSION >= 70
#define AIACC_DCT_SCALED_SIZE DCT_h_scaled_size
#define AIACC_MIN_DCT_SCALED_SIZE min_DCT_h_scaled_size
#else
#define AIACC_DCT_SCALED_SIZE DCT_scaled_size
#define AIACC_MIN_DCT_SCALED_SIZE min_DCT_scaled_size
#endif

std::atomic<bool> g_enabled{true};
std::atomic<uint64_t> g_installed{0}, g_failed{0};

// The public head of libjpeg's entropy decoder module (jpegint.h's struct
// jpeg_entropy_decoder, which jpeglib.h leaves incomplete): the same three members in every
// libjpeg 6.2 build.
struct EntropyModule {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
  boolean insufficient_data;
};

boolean hookedDecodeMcu(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  auto* hook = static_cast<EntropyHook*>(cinfo->client_data);
  // A JBLOCKROW points at a block of 64 JCOEFs (short).
  static_assert(sizeof(JCOEF) == sizeof(int16_t));
  return hook->mcu(reinterpret_cast<int16_t* const*>(MCU_data));
}

// The file's table, from a per-thread cache of the last 16 distinct ones (a dataset's files share
// a few, often the JPEG standard's): no table built, no 2.5 KB cleared, per decode.
const jpeg::Huffman* cachedTable(const JHUFF_TBL* t) {
  if (t == nullptr) return nullptr;
  const uint8_t* bits = t->bits + 1;
  int n = 0;
  for (int l = 0; l < 16; ++l) n += bits[l];
  if (n > 256) return nullptr;
  // Least recently used first: a hit moves to the back, so the (at most 8) tables of the decode
  // in progress are never the one evicted.
  thread_local std::vector<std::unique_ptr<jpeg::Huffman>> cache;
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    const jpeg::Huffman& h = **it;
    if (h.nsym == n && std::equal(bits, bits + 16, h.counts.begin()) &&
        std::equal(t->huffval, t->huffval + n, h.vals.begin())) {
      std::rotate(it, it + 1, cache.end());
      return cache.back().get();
    }
  }
  auto h = std::make_unique<jpeg::Huffman>();
  if (!h->build(bits, t->huffval)) return nullptr;
  if (cache.size() >= 16) cache.erase(cache.begin());
  cache.push_back(std::move(h));
  return cache.back().get();
}

}  // namespace

void EntropyHook::enable(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool EntropyHook::enabled() { return g_enabled.load(std::memory_order_relaxed); }
EntropyHook::Counts EntropyHook::counts() {
  huffmanTakeover();  // its self-check's decodes come before any count (see the header)
  return {g_installed.load(std::memory_order_relaxed), g_failed.load(std::memory_order_relaxed)};
}

bool EntropyHook::install(jpeg_decompress_struct* cinfo, const uint8_t* data, size_t size, bool crop,
                          unsigned crop_xoffset, unsigned crop_width, JpegIndexBuilder* index, const JpegIndex* seek) {
  if (cinfo->entropy == nullptr || cinfo->src == nullptr) return false;
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 || cinfo->restart_interval != 0 ||
      cinfo->comps_in_scan != cinfo->num_components || cinfo->comps_in_scan > 4 || cinfo->blocks_in_MCU > 10 ||
      cinfo->blocks_in_MCU < 1) {
    return false;
  }
  // libjpeg read the markers up to the end of the SOS segment and nothing after it: the source
  // (jpeg_mem_src over data) stands at the first byte of the entropy-coded data.
  const uint8_t* next = reinterpret_cast<const uint8_t*>(cinfo->src->next_input_byte);
  if (next < data || next > data + size) return false;
  const size_t scan_at = static_cast<size_t>(next - data);

  bool used_dc[4] = {false, false, false, false}, used_ac[4] = {false, false, false, false};
  for (int ci = 0; ci < cinfo->comps_in_scan; ++ci) {
    const jpeg_component_info* c = cinfo->cur_comp_info[ci];
    if (c->dc_tbl_no < 0 || c->dc_tbl_no > 3 || c->ac_tbl_no < 0 || c->ac_tbl_no > 3) return false;
    if (!used_dc[c->dc_tbl_no] && !(dc_[c->dc_tbl_no] = cachedTable(cinfo->dc_huff_tbl_ptrs[c->dc_tbl_no])))
      return false;
    if (!used_ac[c->ac_tbl_no] && !(ac_[c->ac_tbl_no] = cachedTable(cinfo->ac_huff_tbl_ptrs[c->ac_tbl_no])))
      return false;
    used_dc[c->dc_tbl_no] = used_ac[c->ac_tbl_no] = true;
  }
  nblocks_ = cinfo->blocks_in_MCU;
  for (int b = 0; b < nblocks_; ++b) {
    const int ci = cinfo->MCU_membership[b];
    if (ci < 0 || ci >= cinfo->comps_in_scan) return false;
    const jpeg_component_info* c = cinfo->cur_comp_info[ci];
    Block& k = blocks_[b];
    k.comp = ci;
    k.dc = dc_[c->dc_tbl_no];
    k.dc_values = &jpeg::dcValueTables(*k.dc);
    k.ac = ac_[c->ac_tbl_no];
    k.values = &jpeg::valueTables(*k.ac);
    k.walk = &jpeg::walkTables(*k.ac);
    // A component whose inverse DCT gives 1x1 (at 1/8 scale; chroma may get 2x2 there) reads
    // the DC coefficient only.
    k.ac_needed = c->AIACC_DCT_SCALED_SIZE > 1;
  }
  mcus_per_row_ = static_cast<int>(cinfo->MCUs_per_row);
  if (mcus_per_row_ < 1) return false;
  first_col_ = 0;
  last_col_ = mcus_per_row_ - 1;
  if (crop) {
    // The columns libjpeg-turbo's jpeg_crop_scanline keeps (first_iMCU_col, last_iMCU_col),
    // from the same arithmetic on the offset and width it returned.
    const unsigned align = (cinfo->comps_in_scan == 1 && cinfo->num_components == 1)
                               ? static_cast<unsigned>(cinfo->AIACC_MIN_DCT_SCALED_SIZE)
                               : static_cast<unsigned>(cinfo->AIACC_MIN_DCT_SCALED_SIZE * cinfo->max_h_samp_factor);
    if (align == 0) return false;
    first_col_ = static_cast<int>(crop_xoffset / align);
    last_col_ = static_cast<int>((crop_xoffset + crop_width + align - 1) / align) - 1;
  }

  // The index's MCU grid must be libjpeg's (it is, for every file JpegIndexBuilder takes).
  if (index && (index->mcusPerRow() != mcus_per_row_ || index->scanAt() != scan_at)) index = nullptr;
  if (seek && (seek->mcusX() != mcus_per_row_ || seek->components() != cinfo->comps_in_scan)) seek = nullptr;
  if (seek) index = nullptr;
  seek_ = seek;
  positioned_ = false;
  ncomps_ = cinfo->comps_in_scan;
  row_ = 0;
  thread_local std::vector<uint8_t> scan;
  thread_local std::vector<uint32_t> skipped;
  skipped.clear();
  size_t produced = 0;
  stop_ = jpeg::unstuff(data, size, scan_at, size, scan, &produced, index ? &skipped : nullptr);
  index_ = index;
  skipped_ = &skipped;
  // Padding past the data: a corrupt MCU can run on for 10 blocks x 64 x 31 bits (2.5 KB) before
  // the check at its end.
  scan.resize(produced + 4096, 0);
  buf_ = &scan;
  pos_ = 0;
  limit_ = static_cast<uint64_t>(produced) * 8;
  col_ = 0;
  failed_ = false;
  for (int& p : pred_) p = 0;

  g_installed.fetch_add(1, std::memory_order_relaxed);
  cinfo->client_data = this;
  reinterpret_cast<EntropyModule*>(cinfo->entropy)->decode_mcu = hookedDecodeMcu;
  return true;
}

std::unique_ptr<JpegIndex> EntropyHook::finishIndex() {
  if (failed_ || !index_) return nullptr;
  return index_->finish(buf_->data(), limit_, pos_, pred_, *skipped_, stop_);
}

void EntropyHook::fail() {
  failed_ = true;
  g_failed.fetch_add(1, std::memory_order_relaxed);
}

int EntropyHook::mcu(int16_t* const* blocks) {
  const int col = col_, row = row_;
  if (++col_ == mcus_per_row_) {
    col_ = 0;
    ++row_;
  }
  if (failed_) return TRUE;  // the caller decodes the file again; the rest stays zero
  const bool store = blocks != nullptr && col >= first_col_ && col <= last_col_;
  if (seek_) {
    // With the file's index, only the MCUs whose coefficients are used are touched: the others
    // return at once, and the next used one starts from the index's checkpoint before it.
    if (!store) {
      positioned_ = false;
      return TRUE;
    }
    if (!positioned_) {
      const int c0 = col / seek_->colsPerCheckpoint() * seek_->colsPerCheckpoint();
      if (row >= seek_->mcusY()) {
        fail();
        return TRUE;
      }
      pos_ = seek_->checkpointBit(row, c0);
      const int16_t* dc = seek_->checkpointDc(row, c0);
      for (int c = 0; c < ncomps_; ++c) pred_[c] = dc[c];
      for (int c = c0; c < col; ++c) {
        if (!decodeOne(nullptr, false)) return TRUE;
      }
      positioned_ = true;
    }
  } else if (index_ && !index_->mcu(pos_, pred_, *skipped_)) {
    index_ = nullptr;  // not indexable after all
  }
  decodeOne(blocks, store);
  return TRUE;
}

bool EntropyHook::decodeOne(int16_t* const* blocks, bool store) {
  jpeg::FastWalker w(buf_->data(), pos_);
  for (int b = 0; b < nblocks_; ++b) {
    const Block& k = blocks_[b];
    int diff;
    if (!w.dcValue(*k.dc_values, *k.dc, diff)) {
      fail();
      return false;
    }
    // int arithmetic as libjpeg's (the stored coefficient keeps the low 16 bits)
    pred_[k.comp] += diff;
    bool ok;
    if (store) {
      blocks[b][0] = static_cast<int16_t>(pred_[k.comp]);
      ok = k.ac_needed ? w.acValues(*k.values, *k.ac, blocks[b]) : w.ac(*k.walk);
    } else {
      ok = w.ac(*k.walk);
    }
    if (!ok) {
      fail();
      return false;
    }
  }
  pos_ = w.pos();
  if (pos_ > limit_) {  // ran past the scan's end: libjpeg-turbo would pad with zeros
    fail();
    return false;
  }
  return true;
}

#undef AIACC_DCT_SCALED_SIZE  // (the unity build: not into the next source)
#undef AIACC_MIN_DCT_SCALED_SIZE

}  // namespace aiacc::data
