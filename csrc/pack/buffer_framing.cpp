// Record-bytes stage (native): see buffer_framing.h.
#include "pack/buffer_framing.h"

#include <cstring>

#include "pack/record_framing.h"

namespace fastload {

size_t frame_buffers_capacity(const std::vector<BufferFrameJob>& jobs, bool gather) {
  size_t total = 0;
  for (const BufferFrameJob& j : jobs) {
    total += gather ? 8 + j.head_len + 3 : framed_record_size(j.head_len + j.size);
  }
  return total;
}

size_t frame_buffers(const std::vector<BufferFrameJob>& jobs, int64_t max_pixels, bool gather, uint8_t* out,
                     size_t capacity, int64_t* sizes) {
  size_t pos = 0;
  size_t pad = 0;  // gathered: the zero padding owed after the last framed record
  for (size_t i = 0; i < jobs.size(); ++i) {
    const BufferFrameJob& job = jobs[i];
    const size_t payload = job.head_len + job.size;
    if (job.size > kMaxRecordPayload || payload > kMaxRecordPayload || (job.head_len & 3) != 0) {
      sizes[i] = kFrameUnsupported;
      continue;
    }
    const size_t need = framed_record_size(payload);
    const size_t takes = gather ? pad + 8 + job.head_len + 3 : need;  // (3: room for this one's padding)
    if (takes > capacity - pos) {
      sizes[i] = kFrameUnsupported;
      continue;
    }
    // Checked where it lies, before anything is written: a refused image costs only its walk.
    JpegFrameSize frame;
    if (job.data == nullptr || !passable_jpeg(job.data, job.size, &frame)) {
      sizes[i] = kFrameNotPassable;
      continue;
    }
    if (static_cast<int64_t>(frame.width) * frame.height > max_pixels) {
      sizes[i] = kFrameTooManyPixels;
      continue;
    }
    // The head is whole words, so the payload's aligned words are the head's and then the image's.
    if (has_aligned_magic(job.head, job.head_len) || has_aligned_magic(job.data, job.size)) {
      sizes[i] = kFrameSplit;
      continue;
    }
    sizes[i] = static_cast<int64_t>(need);
    if (gather) {
      std::memset(out + pos, 0, pad);
      pos += pad;
      put_record_words(out + pos, payload);
      if (job.head_len) std::memcpy(out + pos + 8, job.head, job.head_len);
      pos += 8 + job.head_len;
      pad = need - 8 - payload;
      continue;
    }
    uint8_t* rec = out + pos;
    if (job.head_len) std::memcpy(rec + 8, job.head, job.head_len);
    std::memcpy(rec + 8 + job.head_len, job.data, job.size);
    close_framed_record(rec, payload);
    pos += need;
  }
  if (gather) {
    std::memset(out + pos, 0, pad);
    pos += pad;
  }
  return pos;
}

}  // namespace fastload
