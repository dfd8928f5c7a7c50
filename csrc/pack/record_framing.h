// Record-bytes stage (native): image files -> framed RecordIO records, for pass-through packing.
//
// `fastload pack` without --resize stores valid colour JPEGs untouched. Per file that is: read it,
// walk its markers to the first scan (frame, components, precision) and check its end marker, look
// for RecordIO's magic word at aligned payload offsets (dmlc-core would split the record there),
// and frame it (magic, length word, IRHeader, image, zero padding). Done in Python this costs
// ~100 us per file in interpreter overhead and extra copies; here one GIL-free call does a batch,
// each file is read() straight into its place in the caller's buffer, and anything unusual is left
// to the Python path (which owns the conversions and the error messages).
// Plain C++: glue/pack.cpp holds the Python glue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

// One file to frame: the record payload is `head` (IRHeader + labels, a multiple of 4 bytes) and
// then the file's bytes; `size` is what stat reported.
struct FrameJob {
  std::string path;
  size_t size = 0;
  const uint8_t* head = nullptr;
  size_t head_len = 0;
};

// Per-file outcome when the record was not framed (the Python path then handles the file).
enum FrameRefusal : int64_t {
  kFrameUnreadable = -1,     // open/read failed (Python re-reads it and reports the error)
  kFrameSizeChanged = -2,    // the file is not the size stat reported
  kFrameNotPassable = -3,    // not an 8-bit colour JPEG the marker walk can vouch for
  kFrameSplit = -4,          // the payload holds the magic word: a multi-part record
  kFrameUnsupported = -5,    // over RecordIO's 2**29 - 1 byte payload limit, a head that is not
                             // whole words, or no room left in the buffer
  kFrameTooManyPixels = -6,  // (frame_buffers) the frame header declares more than max_pixels pixels
};

// RecordIO's framing word and its largest payload (29 bits of length).
constexpr uint32_t kRecordMagic = 0xCED7230Au;
constexpr size_t kMaxRecordPayload = (static_cast<size_t>(1) << 29) - 1;

// A payload's framed size: magic, length word, the payload padded to whole words.
inline size_t framed_record_size(size_t payload) { return 8 + ((payload + 3) & ~static_cast<size_t>(3)); }

// The framing words of a record written whole (cflag 0): magic and length word, at rec.
void put_record_words(uint8_t* rec, size_t payload);

// Writes the framing of a whole record (cflag 0) whose payload already sits at rec + 8: magic, length
// word and the zero padding after it.
void close_framed_record(uint8_t* rec, size_t payload);

// The marker walk's frame facts (the last frame header before the first scan), for the max_pixels
// check of frame_buffers; filled only when passable_jpeg says true.
struct JpegFrameSize {
  int width = 0;
  int height = 0;
};

// Bytes `frame_files` needs in `out` for these jobs (every record framed whole, plus one byte of
// read-ahead that detects files grown since their stat).
size_t frame_capacity(const std::vector<FrameJob>& jobs);

// Frames the jobs' records back to back into `out` (in job order; refused files take no space).
// `sizes[i]` gets the framed record's byte count (> 0), or a FrameRefusal. Returns the bytes used.
size_t frame_files(const std::vector<FrameJob>& jobs, uint8_t* out, size_t capacity, int64_t* sizes);

// The pass-through verdict on a file's bytes, identical to fastload.pack.convert's marker walk:
// a JPEG whose markers parse up to the first scan, with an 8-bit, 3-component, non-lossless frame
// of non-zero size, and that ends with EOI (trailing zero bytes allowed).
bool passable_jpeg(const uint8_t* data, size_t size, JpegFrameSize* frame = nullptr);

// Whether a payload holds RecordIO's magic word at a 4-byte-aligned offset (whole words only).
bool has_aligned_magic(const uint8_t* data, size_t size);

}  // namespace fastload
