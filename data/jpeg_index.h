// An entropy index of a baseline JPEG: where each MCU row (and every K-th MCU of a row) starts
// in the Huffman-coded data, and the DC predictors there.
//
// Huffman decoding is sequential: to reach a crop's first row and column, a decoder must
// walk every coefficient before it, and to reach the next row, every column after the crop.
// The index (built once per file, along its first decode: JpegIndexBuilder) removes that:
//   - our Huffman decoder (data/entropy_hook.h) seeks: each run of the crop's MCUs in a row
//     starts from the checkpoint before it (checkpointBit, checkpointDc), the rest untouched;
//   - for libjpeg-turbo's decoder, extract() writes a small, standalone baseline JPEG holding
//     only the crop's MCUs, by copying their Huffman bits verbatim and re-encoding the one DC
//     difference per component at the start of each row segment (DC values are coded as
//     differences from the previous block, which is no longer the same block). The coefficients
//     are unchanged, so decoding the extract gives the same pixels as decoding the original,
//     away from the extract's edges (chroma upsampling looks one sample across them; decodeCrop
//     keeps a margin).
//
// The idea is zlib's zran.c (random access into deflate streams by checkpointing the decoder's
// state), applied to JPEG's entropy coding. Only single-scan baseline files without restart
// markers are indexed: build() returns null for progressive, arithmetic-coded, 12-bit,
// multi-scan and restart-interval files, and for corrupt data, which then decode the usual way.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/jpeg_entropy.h"

namespace aiacc::data {

class JpegIndex {
 public:
  // Walks every MCU of data's scan once. cols_per_checkpoint (K >= 1): a checkpoint at every
  // K-th MCU of each row; a larger K is a smaller index and coarser column cropping.
  static std::unique_ptr<JpegIndex> build(const uint8_t* data, size_t size, int cols_per_checkpoint = 2);

  // True when data is (very likely) the file this index was built from: same size, same header
  // and the same bytes at the end of the scan.
  bool matches(const uint8_t* data, size_t size) const;

  int width() const { return width_; }
  int height() const { return height_; }
  int mcuWidth() const { return mcu_w_; }
  int mcuHeight() const { return mcu_h_; }
  int mcusX() const { return mcus_x_; }
  int mcusY() const { return mcus_y_; }
  int colsPerCheckpoint() const { return k_; }
  size_t bytes() const;  // memory held
  int components() const { return ncomp_; }

  // The checkpoint before MCU (r, c), c a multiple of colsPerCheckpoint() (or mcusX(): the next
  // row's start): its bit offset in the unstuffed scan, and the components' DC predictors there.
  uint64_t checkpointBit(int r, int c) const { return bit_[entry(r, c)]; }
  const int16_t* checkpointDc(int r, int c) const { return &dc_[entry(r, c) * static_cast<size_t>(ncomp_)]; }

  // Writes to out a baseline JPEG of MCU rows [r0, r1) and MCU columns [c0, c1) of data (the
  // indexed file): its pixels are the original's rows [r0*mcuHeight, ...) and columns
  // [c0*mcuWidth, ...). c0 must be a multiple of colsPerCheckpoint(), c1 one too or mcusX().
  // Returns false when the file's DC Huffman table has no code for a difference the extract
  // needs (files with optimized tables); the caller then decodes the original. The JPEG is
  // followed by kTailPadding zero bytes (part of out): libjpeg-turbo's fast Huffman decoder runs
  // only while that much data remains in its source; without them the extract's last rows, always
  // inside the crop, would go through its slow decoder.
  static constexpr size_t kTailPadding = 5120;  // 512 bytes x up to 10 blocks per MCU
  bool extract(const uint8_t* data, size_t size, int r0, int r1, int c0, int c1, std::vector<uint8_t>& out) const;

 private:
  friend class JpegIndexBuilder;
  JpegIndex() = default;
  size_t entry(int r, int c) const;  // checkpoint before MCU (r, c); c a multiple of k_ or mcus_x_

  int width_ = 0, height_ = 0;
  int mcu_w_ = 8, mcu_h_ = 8, mcus_x_ = 0, mcus_y_ = 0;
  int k_ = 2, per_row_ = 0;  // checkpoints per MCU row
  int ncomp_ = 0;
  std::vector<jpeg::ScanComponent> comps_;
  size_t size_ = 0;                 // file size
  size_t sof_at_ = 0;               // offset of the SOF marker
  size_t scan_at_ = 0;              // first byte of the entropy-coded data
  uint64_t fingerprint_ = 0;        // hash of the headers and of the scan's last bytes
  std::vector<uint32_t> bit_;       // per checkpoint, then one after the last MCU: bit offset in the unstuffed scan
  std::vector<int16_t> dc_;         // per checkpoint (and the end), ncomp_ DC predictors
  std::vector<uint32_t> row_byte_;  // per MCU row: file offset of the byte holding its first bit
};

// Builds a file's index from a walk over its MCUs in scan order: JpegIndex::build walks them
// itself; our Huffman decoder (data/entropy_hook.h) reports them while it decodes the file, so
// the first decode of a file yields its index for the cost of walking only the MCUs below the
// crop (finish).
class JpegIndexBuilder {
 public:
  // Null when the file cannot be indexed (see JpegIndex).
  static std::unique_ptr<JpegIndexBuilder> start(const uint8_t* data, size_t size, int cols_per_checkpoint);
  ~JpegIndexBuilder();

  int mcusPerRow() const;
  size_t scanAt() const;  // file offset of the entropy-coded data

  // The next MCU in scan order starts at bit pos of the unstuffed scan, with the DC predictors
  // pred (scan order) before it; skipped: unstuff's list of dropped bytes. False when the index
  // cannot hold it (the caller gives up on the index).
  bool mcu(uint64_t pos, const int* pred, const std::vector<uint32_t>& skipped) {
    if (col_ != 0 && col_ % k_ != 0 && col_ + 1 < mcus_x_) {  // the common case: nothing to note
      ++col_;
      return true;
    }
    return mcuSlow(pos, pred, skipped);
  }

  // Walks the MCUs not reported yet through buf (the unstuffed scan: nbits of data, then zero
  // padding), from bit pos with the predictors pred (updated), and returns the index; null when
  // the data is not valid. stop: the file offset unstuff stopped at (EOI must follow the scan).
  std::unique_ptr<JpegIndex> finish(const uint8_t* buf, uint64_t nbits, uint64_t pos, int* pred,
                                    const std::vector<uint32_t>& skipped, size_t stop);

 private:
  JpegIndexBuilder() = default;
  bool mcuSlow(uint64_t pos, const int* pred, const std::vector<uint32_t>& skipped);
  bool checkpoint(uint64_t pos, const int* pred);

  std::unique_ptr<JpegIndex> ix_;
  jpeg::Headers h_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int row_ = 0, col_ = 0;  // the next MCU
  int k_ = 2, mcus_x_ = 1;
  size_t e_ = 0;  // checkpoints written
};

// Indexes of a dataset's files, built on first use by whichever loader thread decodes the file,
// within a memory budget: once it is spent, further files decode without one. Thread-safe.
class JpegIndexCache {
 public:
  JpegIndexCache(size_t files, size_t budget_bytes, int cols_per_checkpoint = 2);
  ~JpegIndexCache();
  JpegIndexCache(const JpegIndexCache&) = delete;
  JpegIndexCache& operator=(const JpegIndexCache&) = delete;

  // The index of file i (whose bytes are data), building it on the first call; null when the file
  // cannot be indexed or the budget is spent.
  const JpegIndex* get(size_t i, const uint8_t* data, size_t size);

  // The index of file i when it has one, else null; *wanted: whether the caller should build it
  // and offer() it (not refused before, budget left).
  const JpegIndex* find(size_t i, bool* wanted) const;
  // Stores a built index for file i (null: the file cannot be indexed); returns the one kept.
  const JpegIndex* offer(size_t i, std::unique_ptr<JpegIndex> built);

  int colsPerCheckpoint() const { return k_; }

  size_t indexedFiles() const { return indexed_.load(); }
  size_t refusedFiles() const { return refused_.load(); }  // not indexable (progressive, ...)
  size_t bytes() const { return bytes_.load(); }

 private:
  enum : uint8_t { kUnknown = 0, kIndexed = 1, kRefused = 2 };
  std::unique_ptr<std::atomic<const JpegIndex*>[]> slots_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  size_t files_;
  size_t budget_;
  int k_;
  std::atomic<size_t> bytes_{0}, indexed_{0}, refused_{0};
};

}  // namespace aiacc::data
