// Restart-indexed JPEGs, decode-time half: turns a crop into a small JPEG made of only the restart
// intervals it needs (the files come from the pack-time transcode, restart_transcode.h; the geometry
// both share is restart_geometry.h).
//
// Why: Huffman decoding is sequential and is most of a decode's cost. The slice keeps DRI = N and
// is k * N MCUs wide (k whole interval columns), so its decoder expects a marker exactly where each
// copied interval ends; the DC predictors restart at every interval, so no interval depends on one
// that was left out.
//
// Geometry (all at full scale, 1/1): an MCU is `mcu_width` x `mcu_height` pixels (8 * max sampling
// factor for interleaved scans, 8x8 for one-component images). A slice starts at (x0, y0), multiples
// of the MCU size; the caller crops (crop_x - x0, crop_y - y0) from the decoded slice. Where a crop
// edge lies on an MCU boundary in a subsampled direction and a neighbour exists, the slice keeps the
// neighbouring MCU column/row too: libjpeg's fancy (triangle) chroma upsampling reads the adjacent
// chroma sample, so without it the crop's edge pixels would differ from a decode of the full image.
// A slice is also never left at most 4 pixels wide (a partial last MCU column alone): libjpeg
// switches to plain (replicating) h2 upsampling for components of <= 2 samples, so such a slice is
// widened by one interval column. If a caller decodes the slice with DCT scaling (scale_num /
// scale_denom = 1/d), it passes d: the MCU geometry and the origin scale with it (origin
// (x0 / d, y0 / d) in scaled pixels) and the padding is decided on scaled MCU boundaries; one MCU is
// still enough because upsampling never reads further than one chroma sample.
//
// Note for region decoders: libjpeg-turbo's jpeg_crop_scanline treats the first and last decoded
// columns as image edges for chroma upsampling, so a cropped decode (plain or of a slice) differs
// from a full decode in those two columns; slices keep exactly the plain region decode's behaviour
// because their MCU grid coincides with the image's.
//
// Plain C++: no Python and no libjpeg calls here (glue/pack.cpp is the glue; batch_decode decodes
// the slices).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/restart_geometry.h"

namespace fastload {

// Parses the headers only (no entropy data). Returns false with a reason when the image is not a
// single-scan baseline/extended sequential Huffman JPEG; a JPEG without DRI parses with
// restart_interval == 0.
bool parse_restart_geometry(const uint8_t* data, size_t size, RestartGeometry* geo, std::string* why);

// Testing hook: true makes the slicer's interval scan use its portable walk even where the
// AVX-512 one is available (both accept and refuse the same inputs).
void restart_force_scalar_scan(bool scalar);

// A slice's entropy data for a decoder that walks the intervals itself (entropy_decode.h): the
// intervals in slice order, unstuffed (0xFF [0xFF...] 0x00 -> 0xFF) and back to back; interval k
// is bytes [offsets[k], offsets[k + 1]). At least kSliceEntropyPad bytes follow the last one, so
// the decoder may read ahead without bounds checks.
struct SliceEntropy {
  std::vector<uint8_t> bytes;
  std::vector<uint32_t> offsets;
};

// The 8-byte window load plus the most one MCU of corrupt data can consume before the decoder's
// per-MCU check stops it (10 blocks x 64 symbols x 31 bits < 2.5 KB).
constexpr size_t kSliceEntropyPad = 4096;

// A crop turned into a small standalone JPEG made of whole restart intervals.
struct RestartSlice {
  // SOI, decode-relevant headers (SOF size patched), intervals, EOI. With separate entropy data,
  // the intervals are in `entropy` instead and `jpeg` ends with EOI right after the SOS header.
  std::vector<uint8_t> jpeg;
  SliceEntropy entropy;
  int x0 = 0;  // slice origin in full-size pixels (multiples of the MCU size)
  int y0 = 0;
  int width = 0;  // slice size in pixels (what a decoder of `jpeg` reports)
  int height = 0;
  int intervals = 0;  // restart intervals copied
  // What the headers claimed (restart_interval 0 when they do not parse or have no DRI), set even
  // when slicing fails: a caller tells plain JPEGs from records whose markers lie without a re-parse.
  RestartGeometry claimed;
  std::vector<uint32_t> scratch;  // interval offsets; kept between calls to avoid reallocations
};

// Builds the slice covering [crop_x, crop_x + crop_w) x [crop_y, crop_y + crop_h) (full-size
// pixels). Scans the entropy data once for RST markers and checks that their count and numbering
// match what DRI and the frame size claim; on any mismatch (or an image it cannot slice) returns
// false with the reason in *why, and the caller decodes the original bytes the plain way. Reuses
// out's buffers.
//
// scale_denom (1, 2, 4, 8) is the DCT scaling the caller will decode the slice with: the scaled
// output pixels [crop_x / d, ceil((crop_x + crop_w) / d)) (and likewise rows) then match a scaled
// decode of the whole image, the slice origin being (x0 / d, y0 / d) in scaled pixels. The padding
// rule depends on it: at 1/2, 4:2:2 chroma is still fancy-upsampled in scaled space, so an output
// edge on a scaled MCU boundary needs its neighbour even when the full-size crop edge is not on one.
//
// separate_entropy: the intervals go to out->entropy (unstuffed) instead of into out->jpeg.
bool build_restart_slice(const uint8_t* data, size_t size, int crop_x, int crop_y, int crop_w, int crop_h,
                         RestartSlice* out, std::string* why, int scale_denom = 1, bool separate_entropy = false);

}  // namespace fastload
