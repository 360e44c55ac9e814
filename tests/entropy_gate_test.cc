// The libjpeg-turbo gate of aiacc's Huffman decoder (data/entropy_gate.h): on this machine's
// libjpeg-turbo the self-check passes and the takeover stays on; an untested version or a
// self-check mismatch turns it off, with the reason, and decodes stay libjpeg-turbo's pixels.
// Real decodes throughout; the mismatch is injected through the self-check's tamper seam.
#include "data/entropy_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "data/decode.h"
#include "data/entropy_hook.h"
#include "tests/jpeg_test_util.h"

namespace aiacc::data {
namespace {

using test::encode;
using test::EncodeOptions;
using test::texture;

DecodedCrop decodeBox(const std::vector<uint8_t>& jpg, const Box& box, int out, HuffmanDecoder huffman) {
  return decodeCrop(
      jpg.data(), jpg.size(), [&](int, int) { return box; }, out, out, nullptr, true, nullptr, huffman);
}

bool startsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

TEST(EntropyGate, SelfCheckPassesOnThisLibjpegTurbo) {
  const int v = compiledLibjpegTurboVersion();
  EXPECT_EQ(v, 2001005) << "Debian 12's libjpeg62-turbo-dev is 2.1.5: a new version wants testing, then "
                           "kTestedLibjpegTurboVersions";
  EXPECT_EQ(huffmanTakeoverAllowed(v), "");
  EXPECT_EQ(huffmanTakeoverSelfCheck(), "");
  const HuffmanTakeover& gate = huffmanTakeover();
  EXPECT_TRUE(gate.enabled) << gate.reason;
  EXPECT_EQ(gate.reason, "");
  EXPECT_EQ(gate.version_number, v);
  EXPECT_EQ(gate.decoder(), HuffmanDecoder::kAiacc);
  // decodeCrop's default uses the takeover, with libjpeg-turbo's pixels.
  const std::vector<uint8_t> jpg = encode(texture(200, 150, 2), EncodeOptions{});
  const DecodedCrop got = decodeBox(jpg, Box{30, 20, 120, 90}, 60, HuffmanDecoder::kProcessDefault);
  const DecodedCrop want = decodeBox(jpg, Box{30, 20, 120, 90}, 60, HuffmanDecoder::kLibjpegTurbo);
  EXPECT_TRUE(got.aiacc_huffman);
  EXPECT_FALSE(want.aiacc_huffman);
  EXPECT_TRUE(got.crop.pixels == want.crop.pixels);
}

TEST(EntropyGate, VersionsOutsideTheTestedListAreRefusedWithTheReason) {
  EXPECT_EQ(huffmanTakeoverAllowed(0),
            "libjpeg-turbo version unknown (jconfig.h defines no LIBJPEG_TURBO_VERSION_NUMBER); tested: 2.1.5");
  EXPECT_EQ(huffmanTakeoverAllowed(3000001), "libjpeg-turbo 3.0.1 (3000001) is not in the tested list (2.1.5)");
  // 2.0 (other skip and decoder code), untested 2.1 releases, 3.0 betas and releases.
  for (int v : {-1, 1005003, 2000006, 2001000, 2001004, 2001006, 2001090, 3000000, 3001002}) {
    EXPECT_NE(huffmanTakeoverAllowed(v), "") << v;
  }
  for (int v : kTestedLibjpegTurboVersions) EXPECT_EQ(huffmanTakeoverAllowed(v), "") << v;

  int self_check_decodes = 0;  // the self-check does not even run on an untested layout
  const SelfCheckTamper count = [&](RgbImage&) { ++self_check_decodes; };
  for (int v : {0, 3000001}) {
    const HuffmanTakeover r = checkHuffmanTakeover(v, count);
    EXPECT_FALSE(r.enabled);
    EXPECT_EQ(r.reason, huffmanTakeoverAllowed(v));
    EXPECT_EQ(r.version_number, v);
    EXPECT_EQ(r.decoder(), HuffmanDecoder::kLibjpegTurbo);
  }
  EXPECT_EQ(self_check_decodes, 0);
  // On the tested version it runs, every case of both samplings through the seam.
  const HuffmanTakeover ok = checkHuffmanTakeover(2001005, count);
  EXPECT_TRUE(ok.enabled) << ok.reason;
  EXPECT_EQ(self_check_decodes, 12);
}

// A self-check whose takeover decode differs (one byte flipped, or a row fewer, in the k-th case)
// turns the takeover off, saying where; decodes under that outcome are libjpeg-turbo's, exactly.
TEST(EntropyGate, SelfCheckMismatchFallsBackToLibjpegTurbosDecoder) {
  int calls = 0;
  const HuffmanTakeover flipped = checkHuffmanTakeover(2001005, [&](RgbImage& img) {
    if (++calls == 1) img.pixels[5] = static_cast<uint8_t>(img.pixels[5] ^ 1);
  });
  EXPECT_EQ(calls, 1);  // stops at the first mismatch
  EXPECT_FALSE(flipped.enabled);
  EXPECT_TRUE(startsWith(flipped.reason, "self-check mismatch: the built-in 4:2:0 image, whole at 8/8: byte 5 of "))
      << flipped.reason;
  EXPECT_EQ(flipped.decoder(), HuffmanDecoder::kLibjpegTurbo);

  calls = 0;
  const HuffmanTakeover shorter = checkHuffmanTakeover(2001005, [&](RgbImage& img) {
    if (++calls == 9) {  // the third case of 4:4:4
      img.height -= 1;
      img.pixels.resize(img.pixels.size() - img.rowBytes());
    }
  });
  EXPECT_FALSE(shorter.enabled);
  EXPECT_TRUE(startsWith(shorter.reason, "self-check mismatch: the built-in 4:4:4 image, box 19,21 37x29 at 2/8: "))
      << shorter.reason;

  // Decoding under the failed outcome: libjpeg-turbo's decoder for every sampling and crop, its
  // pixels exactly, and none of it through aiacc's decoder.
  const EntropyHook::Counts before = EntropyHook::counts();
  for (const test::Picture& c : test::samplings()) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> jpg = encode(texture(c.w, c.h, 7), c.o);
    for (const Box box : {Box{0, 0, c.w, c.h}, Box{c.w / 5, c.h / 4, c.w / 2, c.h / 2}}) {
      for (int out : {16, 64, kFullResolution}) {
        const DecodedCrop got = decodeBox(jpg, box, out, flipped.decoder());
        EntropyHook::enable(false);  // libjpeg-turbo's decoder by the process-wide switch
        const DecodedCrop want = decodeBox(jpg, box, out, HuffmanDecoder::kProcessDefault);
        EntropyHook::enable(true);
        const DecodedCrop own = decodeBox(jpg, box, out, HuffmanDecoder::kAiacc);
        EXPECT_FALSE(got.aiacc_huffman);
        EXPECT_FALSE(want.aiacc_huffman);
        EXPECT_TRUE(own.aiacc_huffman);
        ASSERT_EQ(got.scale_num, want.scale_num);
        ASSERT_EQ(got.crop.width, want.crop.width);
        ASSERT_EQ(got.crop.height, want.crop.height);
        EXPECT_TRUE(got.crop.pixels == want.crop.pixels) << "out " << out;
        EXPECT_TRUE(own.crop.pixels == want.crop.pixels) << "out " << out;
      }
    }
  }
  // Only the kAiacc decodes went through aiacc's decoder.
  EXPECT_EQ(EntropyHook::counts().installed - before.installed, test::samplings().size() * 2 * 3);
}

// An error inside the self-check (here: thrown by the seam) disables the takeover; nothing throws.
TEST(EntropyGate, SelfCheckErrorDisablesWithoutThrowing) {
  HuffmanTakeover r;
  EXPECT_NO_THROW(r = checkHuffmanTakeover(2001005, [](RgbImage&) { throw std::runtime_error("injected"); }));
  EXPECT_FALSE(r.enabled);
  EXPECT_EQ(r.reason, "self-check error: injected");
}

// The process's gate runs once: every thread, first callers racing included, gets the same result.
TEST(EntropyGate, ProcessGateIsOneResultForEveryThread) {
  std::vector<const HuffmanTakeover*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) threads.emplace_back([&, t] { seen[t] = &huffmanTakeover(); });
  for (std::thread& th : threads) th.join();
  for (const HuffmanTakeover* p : seen) EXPECT_EQ(p, &huffmanTakeover());
  const EntropyHook::Counts a = EntropyHook::counts();
  EXPECT_TRUE(huffmanTakeover().enabled);
  EXPECT_EQ(EntropyHook::counts().installed, a.installed);  // no second self-check
}

}  // namespace
}  // namespace aiacc::data
