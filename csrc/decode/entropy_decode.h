// Pixels stage (native): the Huffman decoder restart-interval slices run instead of libjpeg's.
//
// Why: on a restart-indexed crop, libjpeg's Huffman decoding was about 60% of the whole decode
// (perf), and libjpeg-turbo turns its fast Huffman path off whenever a restart interval is set, so
// every sliced image went through its byte-at-a-time path (a refill call every few bytes, a 0xFF
// check per byte, a marker read per interval). A slice is known in advance: the slicer has already
// found every interval's bytes, so here the intervals arrive unstuffed (0xFF 0x00 -> 0xFF) and back
// to back in one buffer with their offsets. Each symbol then costs one unaligned 64-bit load, one
// table lookup and shifts; an interval switch is a pointer move, with no marker to parse.
//
// It plugs into libjpeg as the decompressor's entropy module (jpeg_entropy_decoder, jpegint.h) once
// jpeg_start_decompress has set everything else up, so dequantization, IDCT, upsampling, colour
// conversion and cropping stay libjpeg's and the pixels are libjpeg's own. The coefficients are the
// ones libjpeg's decoder yields for well-formed data. Anything else (an invalid code, an interval
// whose symbols need more bits than it holds or leave a byte or more unused) stops the decoder;
// the caller then decodes the original file the plain way, so malformed data never produces pixels
// other than libjpeg's.
//
// Plain C++ over the libjpeg API; no Python here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "decode/jpeg_decode.h"
#include "decode/restart_slice.h"

namespace fastload {

struct EntropyGlue;

// Whether this build can replace libjpeg's entropy decoder (it needs libjpeg's jpegint.h). Each
// decode call chooses (DecodeSettings::slice_entropy); where it is not built, or with
// EntropyDecoder::kLibjpeg, slices keep their RST markers and go through libjpeg's decoder.
bool interval_entropy_available();

// One per decode thread, reused. Hooked into a JpegDecoder for one decode_region call.
class IntervalEntropyDecoder final : public EntropyOverride {
 public:
  IntervalEntropyDecoder();
  ~IntervalEntropyDecoder() override;
  IntervalEntropyDecoder(const IntervalEntropyDecoder&) = delete;
  IntervalEntropyDecoder& operator=(const IntervalEntropyDecoder&) = delete;

  // Feeds the next decode from `data` (kept by pointer until that decode ends).
  void reset(const SliceEntropy* data);
  bool install(jpeg_decompress_struct* cinfo) override;
  // True once the decoder has refused the data; the decode's pixels must then be discarded.
  bool failed() const { return failed_; }

  struct Table;  // a Huffman table in lookup form (defined in the .cpp)

 private:
  bool decode_mcu(jpeg_decompress_struct* cinfo, JBLOCKROW* mcu) noexcept;
  bool next_interval() noexcept;
  bool fail() noexcept;
  friend struct EntropyGlue;

  const SliceEntropy* data_ = nullptr;
  std::vector<Table> tables_;  // [0, 4): DC tables, [4, 8): AC tables (by table number)
  const Table* dc_[10] = {};   // per block of the MCU
  const Table* ac_[10] = {};
  int comp_[10] = {};  // component (index within the scan) of each block
  int blocks_ = 0;
  int restart_interval_ = 0;
  int mcus_left_ = 0;    // MCUs still to decode in the current interval
  size_t interval_ = 0;  // current interval
  uint64_t pos_ = 0;     // bit position in data_->bytes
  uint64_t end_ = 0;     // bit position where the current interval ends
  int dc_pred_[4] = {};
  bool failed_ = false;
  std::unique_ptr<EntropyGlue> glue_;  // the jpeg_entropy_decoder libjpeg calls (see .cpp)
};

}  // namespace fastload
