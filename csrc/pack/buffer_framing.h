// Record-bytes stage (native): images already in memory -> framed RecordIO records, for the
// pass-through pack of streamed input (a tar's members, a parquet image column).
//
// The same checks and bytes as frame_files (pack/record_framing.h) without the file reads: each
// image is a range of memory the caller holds (a slice of the chunk read from a tar, a cell of an
// Arrow binary column), checked by the same marker walk, its declared size held against max_pixels
// and looked through for RecordIO's magic word. Whatever it does not vouch for is refused (a
// FrameRefusal) and left to the Python path, which converts or reports it.
//
// Two layouts of the caller's buffer. Copied: each record framed whole (magic, length word, IRHeader,
// image, zero padding), back to back, as frame_files writes them. Gathered: the images stay where
// they are and the buffer holds what goes between them: before each record, the zero padding of the
// record before it, then the record's magic, length word and IRHeader; after the last one, its
// padding. Writing prefix, image, prefix, image, ..., tail gives the same bytes as the copied layout
// without copying the images (a large image costs more to copy than two gather entries to write).
// Plain C++: glue/ingest.cpp holds the Python glue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastload {

// One in-memory image to frame: the record payload is `head` (IRHeader + labels, a multiple of 4
// bytes) and then the image's `size` bytes at `data`.
struct BufferFrameJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  const uint8_t* head = nullptr;
  size_t head_len = 0;
};

// Bytes `frame_buffers` needs in `out` for these jobs in either layout (every record framed).
size_t frame_buffers_capacity(const std::vector<BufferFrameJob>& jobs, bool gather);

// Frames the jobs' records into `out` in job order, copied or gathered (refused images take no space).
// `sizes[i]` gets the framed record's byte count (> 0), or a FrameRefusal: kFrameNotPassable (not an
// 8-bit colour JPEG the marker walk vouches for), kFrameTooManyPixels (its frame declares more than
// `max_pixels` pixels), kFrameSplit (the payload holds the magic word), kFrameUnsupported (over the
// payload limit, a head that is not whole words, no room left). Returns the bytes of `out` used.
size_t frame_buffers(const std::vector<BufferFrameJob>& jobs, int64_t max_pixels, bool gather, uint8_t* out,
                     size_t capacity, int64_t* sizes);

}  // namespace fastload
