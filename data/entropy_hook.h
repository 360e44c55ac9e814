// Our Huffman decoder in place of libjpeg-turbo's, on one decompressor.
//
// On photo-sized images cropped to 128 px, about 75% of decodeCrop's time is libjpeg-turbo's
// Huffman decoding: every coefficient of every MCU above the crop's last row is decoded with its
// value and stored, including the MCU rows jpeg_skip_scanlines passes over and the MCUs left and
// right of jpeg_crop_scanline's columns, which are then thrown away. This decoder takes over the
// entropy decoder's decode_mcu method (libjpeg's module interface, an ABI every libjpeg 6.2
// build keeps) after jpeg_start_decompress:
//   - MCUs whose coefficients are thrown away (skipped rows, columns outside the crop) are walked
//     without their values, two symbols per table look-up (jpeg::FastWalker::ac, the index's
//     walker);
//   - the others are decoded with a table that gives a symbol's run and sign-extended value in
//     one look-up for most symbols, and two symbols at once where both are short
//     (jpeg::ValueTables); DC codes with their values likewise.
// The coefficients it stores are libjpeg-turbo's, so the pixels are the same (tests compare them
// with libjpeg-turbo's own decoder, byte for byte). It takes only single-scan sequential Huffman
// files without restart markers; on data that is not valid (a bad code, a coefficient past the
// block's end, the scan ending early) it stops decoding and says so through failed(), and the
// caller decodes the file again with libjpeg-turbo's decoder, which then handles the damage its
// usual way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/jpeg_entropy.h"

struct jpeg_decompress_struct;

namespace aiacc::data {

class JpegIndex;
class JpegIndexBuilder;

class EntropyHook {
 public:
  // Takes over cinfo's entropy decoding. Call after jpeg_start_decompress and after any
  // jpeg_crop_scanline (crop: its xoffset and width results were given), before the first
  // jpeg_read_scanlines or jpeg_skip_scanlines. data/size: the buffer given to jpeg_mem_src.
  // Sets cinfo->client_data. Returns false, changing nothing, for files it does not take.
  // Whether to call it at all is the caller's: enabled() and the libjpeg-turbo version gate
  // (data/entropy_gate.h), which decodeCrop consults (HuffmanDecoder).
  // index (optional): reported every MCU as it is decoded or walked, for finishIndex.
  // seek (optional): the file's index; then the MCUs whose coefficients are not used are not
  // even walked (the decode of each used run of MCUs starts from the index's checkpoint).
  bool install(jpeg_decompress_struct* cinfo, const uint8_t* data, size_t size, bool crop, unsigned crop_xoffset,
               unsigned crop_width, JpegIndexBuilder* index = nullptr, const JpegIndex* seek = nullptr);

  // True when install took a seek index.
  bool seeking() const { return seek_ != nullptr; }

  // After the decode: the file's index, the MCUs the decode did not reach walked now; null when
  // install had no builder, or the data was not valid.
  std::unique_ptr<JpegIndex> finishIndex();

  // True when the data was not valid somewhere: the decoded pixels are not to be used.
  bool failed() const { return failed_; }

  // Process-wide switch (tests, aiacc_bench's --libjpeg-huffman A/B): false keeps
  // libjpeg-turbo's decoder for decodeCrop's HuffmanDecoder::kProcessDefault. aiacc_train does
  // not use it: its loaders take the decoder as an option (LoaderOptions::huffman).
  static void enable(bool on);
  static bool enabled();

  // Process-wide counts since start: decodes it took over, and those that found invalid data.
  // The first call runs the libjpeg-turbo gate (data/entropy_gate.h, huffmanTakeover()) if no
  // decode has yet, so that the dozen decodes of its self-check, which count, are in every count
  // taken and in no difference of two.
  struct Counts {
    uint64_t installed = 0, failed = 0;
  };
  static Counts counts();

  // One MCU (the installed decode_mcu calls it): blocks[i] receives the i-th block's
  // coefficients, or blocks is null (coefficients not wanted). Returns libjpeg's TRUE.
  int mcu(int16_t* const* blocks);

 private:
  void fail();
  // One MCU at pos_: decoded into blocks (store) or walked. False when the data is not valid.
  bool decodeOne(int16_t* const* blocks, bool store);

  struct Block {
    int comp = 0;
    const jpeg::Huffman* dc = nullptr;
    const jpeg::DcValueTables* dc_values = nullptr;
    const jpeg::Huffman* ac = nullptr;
    const jpeg::ValueTables* values = nullptr;
    const jpeg::WalkTables* walk = nullptr;
    bool ac_needed = true;
  };

  const jpeg::Huffman* dc_[4] = {nullptr, nullptr, nullptr, nullptr};  // per-thread cache entries
  const jpeg::Huffman* ac_[4] = {nullptr, nullptr, nullptr, nullptr};
  Block blocks_[10];
  int nblocks_ = 0;
  int mcus_per_row_ = 1;
  int col_ = 0, row_ = 0;  // the next MCU
  int ncomps_ = 1;
  const JpegIndex* seek_ = nullptr;
  bool positioned_ = false;           // with seek_: pos_ and pred_ are at the next MCU
  int first_col_ = 0, last_col_ = 0;  // MCU columns whose coefficients are used
  int pred_[4] = {0, 0, 0, 0};
  std::vector<uint8_t>* buf_ = nullptr;  // the unstuffed scan, zero-padded
  JpegIndexBuilder* index_ = nullptr;
  std::vector<uint32_t>* skipped_ = nullptr;  // unstuff's dropped bytes, for index_
  size_t stop_ = 0;                           // file offset where unstuff stopped
  uint64_t pos_ = 0, limit_ = 0;              // bits
  bool failed_ = false;
};

}  // namespace aiacc::data
