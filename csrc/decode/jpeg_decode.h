// Pixels stage (native): libjpeg-turbo decoding through the libjpeg API, with region decode.
//
// One JpegDecoder per worker thread, created once and reused: the jpeg_decompress_struct is kept
// between images (jpeg_abort_decompress resets it), so no per-image setup beyond the header parse.
// libjpeg errors never exit(): the shared error manager (jpeg_io.h) longjmps back and they come out
// as a Status plus libjpeg's message; warnings are counted, never printed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fastload_abi.h"  // Status, DecodeSettings (generated from fastload/engine_abi.py)
#include "common/jpeg_io.h"

namespace fastload {

// Lower-case name of a status ("truncated"), as error messages start.
inline const char* status_name(Status s) { return abi_name(s); }

// What the header said.
struct JpegInfo {
  int width = 0, height = 0;
  int components = 0;
  int orientation = 1;  // EXIF orientation (1 = none), parsed only with apply_exif
};

// Receives the decoded RGB rows of a region. Row pointers are valid during the call only; each row
// has at least `kRowSlackBytes` readable bytes past its last pixel (vector loads may overread).
class RowSink {
 public:
  virtual ~RowSink() = default;
  // Called once before the rows: the region actually decoded starts at column `x_origin` of the
  // (scaled) image and is `width` pixels wide (libjpeg widens crops to iMCU boundaries).
  virtual void begin(int x_origin, int width) = 0;
  // Rows y .. y + count - 1 (count <= kSinkRows).
  virtual void rows(int y, const uint8_t* const* rgb, int count) = 0;
};

constexpr int kRowSlackBytes = 64;
constexpr int kSinkRows = 8;  // rows gathered before each RowSink::rows call

// Replaces libjpeg's entropy decoder for one decode (restart-interval slices, entropy_decode.h).
class EntropyOverride {
 public:
  virtual ~EntropyOverride() = default;
  // Called right after jpeg_start_decompress, before any MCU is decoded. False: it cannot take this
  // image (the decode then fails rather than run libjpeg's decoder on data it was not given).
  virtual bool install(jpeg_decompress_struct* cinfo) = 0;
};

// Dimensions libjpeg produces at scale 1/denom (jdiv_round_up).
inline int scaled_size(int full, int denom) { return (full + denom - 1) / denom; }

// The smallest shrink an antialiased resize may be left after a DCT-scaled decode, by scale.
// libjpeg's scaled IDCT reduces each block on its own (a block-local low-pass, sharper than the
// reference's support-scaled filters and blind to its neighbours); how far the result lands from a
// full-size decode resized by Pillow depends on the shrink g the resize still does afterwards
// (bench.fidelity --residual: generated ImageNet-like and camera-sized JPEGs, per-image mean absolute
// difference in normalized units, the worst image, bilinear / bicubic alike): g in [1, 1.5) 0.11-0.15,
// [2, 2.5) 0.03, [3, 3.5) 0.013-0.025; from g = 4 on 0.012-0.014 at 1/2 and 1/8 but 0.019 at 1/4,
// which falls to 0.013 from g = 5. These minima keep every output size within 0.02 of
// torchvision's PIL pipeline with a margin (docs/fidelity.md). Widening or narrowing the resize's
// filter to make up for the block reduction measured worse at every g.
constexpr double kDctMinResidualShrinkHalf = 4.0;    // at 1/2
constexpr double kDctMinResidualShrinkDeeper = 5.0;  // at 1/4 and 1/8

// DCT scale denominator (1, 2, 4 or 8) for a region `shrink` times larger than the output (the
// smaller of the two axes' factors): the deepest scale that leaves the resize its minimum step.
// One rule for every geometry (crops and warps).
inline int dct_scale_denom(double shrink) {
  if (shrink >= 8 * kDctMinResidualShrinkDeeper) return 8;
  if (shrink >= 4 * kDctMinResidualShrinkDeeper) return 4;
  if (shrink >= 2 * kDctMinResidualShrinkHalf) return 2;
  return 1;
}

class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Parses the header of `data` (kept by pointer until the next open). Rejects empty input,
  // non-JPEG payloads (kNeedsPillow), images above settings.max_pixels and unsupported colour
  // spaces before any pixel memory exists.
  Status open(const uint8_t* data, size_t size, const DecodeSettings& settings, JpegInfo* info);

  // Decodes rows [y0, y1) and at least columns [x0, x1) of the image scaled by 1/denom (denom in
  // 1, 2, 4, 8), handing each row to `sink`; stops once row y1 - 1 is out. Call after open().
  Status decode_region(int denom, int x0, int y0, int x1, int y1, RowSink* sink);

  // The next decode_region (after the next open) takes its coefficients from `e` instead of
  // libjpeg's Huffman decoder. Cleared by open().
  void override_entropy(EntropyOverride* e) { entropy_override_ = e; }

  // Full-size decode into `dst` (height rows of width * 3 bytes). Call after open().
  Status decode_full(uint8_t* dst);

  const std::string& message() const { return message_; }
  int warnings() const { return err_.warnings; }  // warnings since the last open()

 private:
  void reset_state();
  // After a libjpeg error jumped back: aborts the decompressor, keeps libjpeg's message and maps
  // its error code to a status.
  Status failed();
  void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int width) const;
  void configure_output(int denom);
  // Ends a decode: releases libjpeg's state and turns early EOF / missing rows into a status.
  Status finish(bool complete);

  jpeg_decompress_struct cinfo_;
  JpegErrorManager err_;
  bool header_ok_ = false;
  bool cmyk_ = false;
  bool adobe_ = false;
  DecodeSettings settings_;
  std::string message_;
  EntropyOverride* entropy_override_ = nullptr;
  std::vector<uint8_t> row_buf_;   // RGB rows handed to the sink
  std::vector<uint8_t> cmyk_buf_;  // raw CMYK rows before conversion
};

// Scans the APP1 Exif segment for the orientation tag; returns 1 when absent or unreadable.
int exif_orientation(const uint8_t* app1, size_t size);

}  // namespace fastload
