// Whether aiacc's Huffman decoder (data/entropy_hook.h) may take over libjpeg-turbo's entropy
// decoding in this process.
//
// The takeover is not libjpeg's public API: it overwrites decode_mcu in libjpeg-turbo's internal
// entropy-decoder module (jpegint.h's struct jpeg_entropy_decoder), relies on how
// jpeg_skip_scanlines and the coefficient controller call it (a null block pointer for
// coefficients thrown away), and repeats jpeg_crop_scanline's iMCU-column arithmetic. These are
// implementation details that releases change:
//   - 2.0 -> 2.1: jpeg_skip_scanlines reads the rows it skips (decode_mcu with buffers) under
//     merged upsampling, and jdhuff.c's decoders changed (jdapistd.c, jdhuff.c);
//   - 2.1 -> 3.0: struct jpeg_entropy_decoder gains decode_mcus (lossless JPEG) between
//     decode_mcu and insufficient_data, and an 8-bit lossless file, which the hook cannot tell
//     from a sequential one through jpeglib.h, is decoded through decode_mcus, never decode_mcu.
// So the takeover is on only where both hold:
//   1. (compile time) LIBJPEG_TURBO_VERSION_NUMBER from jconfig.h is a version the takeover was
//      tested against: 2.1.5 (2001005), Debian 12's libjpeg62-turbo, where the whole test suite
//      runs. Other 2.1.x releases differ from 2.1.5 in none of the code the
//      hook relies on (git diff 2.1.0..2.1.5 of jpegint.h, jdhuff.c, jdcoefct.c, jdapistd.c), but
//      are not tested: add one to kTestedLibjpegTurboVersions after tests/entropy_hook_test.cc and
//      tests/entropy_gate_test.cc pass against it. No version macro: the version is unknown.
//   2. (first decode of the process) a self-check decodes a built-in image (a baseline JPEG
//      encoded with TurboJPEG, 4:2:0 and 4:4:4, several MCUs, no restart markers: the hook takes
//      no file with them) with libjpeg-turbo's decoder and with the takeover, whole and cropped
//      at several DCT scales, with and without the file's JPEG index, and compares the pixels
//      byte for byte. This catches a runtime library other than the headers compiled against.
// Otherwise libjpeg-turbo's own decoder decodes every file, and one log line (glog WARNING) says
// why:
//   aiacc data: JPEG Huffman decoding stays with libjpeg-turbo (aiacc's decoder is off): <reason>
#pragma once

#include <functional>
#include <string>

#include "data/decode.h"

namespace aiacc::data {

// The versions (LIBJPEG_TURBO_VERSION_NUMBER: major * 1000000 + minor * 1000 + patch) whose
// internal layout the takeover was tested against.
inline constexpr int kTestedLibjpegTurboVersions[] = {2001005};

// LIBJPEG_TURBO_VERSION_NUMBER of the libjpeg-turbo headers this build compiled against; 0 when
// jconfig.h defines none (not libjpeg-turbo, or too old to say).
int compiledLibjpegTurboVersion();

// "" when the version is in kTestedLibjpegTurboVersions; otherwise the reason the takeover stays
// off (names the version, or says it is unknown for 0, and the tested list). Pure.
std::string huffmanTakeoverAllowed(int version_number);

// The outcome of the gate.
struct HuffmanTakeover {
  bool enabled = false;
  std::string reason;      // why not; "" when enabled
  int version_number = 0;  // the version checked
  // The decoder decodeCrop is to use under this outcome.
  HuffmanDecoder decoder() const { return enabled ? HuffmanDecoder::kAiacc : HuffmanDecoder::kLibjpegTurbo; }
};

// Called with the takeover's decode of each self-check case before it is compared with
// libjpeg-turbo's (tests: a forced mismatch). May change the pixels.
using SelfCheckTamper = std::function<void(RgbImage& takeover_decode)>;

// Runs the whole gate, uncached and without logging: the version check, then (only when that
// passes) the self-check. Never throws: an error during the self-check disables the takeover,
// with the error as the reason.
HuffmanTakeover checkHuffmanTakeover(int version_number, const SelfCheckTamper& tamper = nullptr);

// The self-check alone: "" when every case decodes to the same pixels both ways, else what
// differed. Throws what decodeCrop throws.
std::string huffmanTakeoverSelfCheck(const SelfCheckTamper& tamper = nullptr);

// The process's gate: checkHuffmanTakeover(compiledLibjpegTurboVersion()), run once (the first
// call, thread-safe; concurrent first callers wait for it), logging its one line when the
// takeover is off. decodeCrop's HuffmanDecoder::kProcessDefault consults it.
const HuffmanTakeover& huffmanTakeover();

}  // namespace aiacc::data
