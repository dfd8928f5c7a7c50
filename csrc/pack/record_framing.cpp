// Record-bytes stage (native): see record_framing.h.
#include "pack/record_framing.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fastload {

namespace {

inline bool is_sof(int m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

inline bool is_standalone(int m) { return (m >= 0xD0 && m <= 0xD7) || m == 0x01 || m == 0xD8; }

inline void put_le32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v), p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16), p[3] = static_cast<uint8_t>(v >> 24);
}

// Reads up to `want` bytes (fewer at end of file). Returns the count, or -1 on error or when the
// path is not a regular file: O_NONBLOCK so that a FIFO (or device) put where a listed file was
// never blocks the open, and fstat on the opened descriptor so it is never read either.
long long read_file(const char* path, uint8_t* dst, size_t want) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return -1;
  }
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::read(fd, dst + got, want - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return -1;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return static_cast<long long>(got);
}

}  // namespace

bool passable_jpeg(const uint8_t* d, size_t n, JpegFrameSize* frame) {
  if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return false;
  size_t pos = 2;
  bool have_frame = false;
  int components = 0, precision = 0, width = 0, height = 0;
  bool lossless = false;
  for (;;) {
    if (pos + 4 > n || d[pos] != 0xFF) return false;
    const int m = d[pos + 1];
    if (m == 0xFF) {  // fill byte
      pos += 1;
      continue;
    }
    if (is_standalone(m)) {
      pos += 2;
      continue;
    }
    if (m == 0xD9) return false;
    const size_t seglen = (static_cast<size_t>(d[pos + 2]) << 8) | d[pos + 3];
    if (seglen < 2 || pos + 2 + seglen > n) return false;
    if (is_sof(m)) {
      if (seglen < 8) return false;
      // The last frame header before the scan is the one that counts, as in the Python walk.
      precision = d[pos + 4];
      height = (d[pos + 5] << 8) | d[pos + 6];
      width = (d[pos + 7] << 8) | d[pos + 8];
      components = d[pos + 9];
      lossless = m == 0xC3 || m == 0xC7 || m == 0xCB || m == 0xCF;
      have_frame = true;
    } else if (m == 0xDA) {
      if (!have_frame) return false;
      break;
    }
    pos += 2 + seglen;
  }
  // A file cut short lacks EOI: entropy data never holds FF D9. Some writers pad with zeros.
  size_t end = n;
  const size_t floor = n > 64 ? n - 64 : 0;
  while (end > floor && d[end - 1] == 0) --end;
  if (end - floor < 2 || d[end - 2] != 0xFF || d[end - 1] != 0xD9) return false;
  if (components != 3 || precision != 8 || lossless || width <= 0 || height <= 0) return false;
  if (frame != nullptr) frame->width = width, frame->height = height;
  return true;
}

void put_record_words(uint8_t* rec, size_t payload) {
  put_le32(rec, kRecordMagic);
  put_le32(rec + 4, static_cast<uint32_t>(payload));  // cflag 0: the record goes out whole
}

void close_framed_record(uint8_t* rec, size_t payload) {
  put_record_words(rec, payload);
  std::memset(rec + 8 + payload, 0, framed_record_size(payload) - 8 - payload);
}

bool has_aligned_magic(const uint8_t* data, size_t size) {
  const size_t words = size >> 2;
  constexpr size_t kBlock = 64;
  size_t i = 0;
  // Branch-free blocks so the compare vectorizes; the magic word is almost never there.
  for (; i + kBlock <= words; i += kBlock) {
    uint32_t hit = 0;
    for (size_t j = 0; j < kBlock; ++j) {
      uint32_t w;
      std::memcpy(&w, data + 4 * (i + j), 4);
      hit |= static_cast<uint32_t>(w == kRecordMagic);
    }
    if (hit) return true;
  }
  for (; i < words; ++i) {
    uint32_t w;
    std::memcpy(&w, data + 4 * i, 4);
    if (w == kRecordMagic) return true;
  }
  return false;
}

size_t frame_capacity(const std::vector<FrameJob>& jobs) {
  size_t total = 1;  // the read-ahead byte of the last file
  for (const FrameJob& j : jobs) total += framed_record_size(j.head_len + j.size);
  return total;
}

size_t frame_files(const std::vector<FrameJob>& jobs, uint8_t* out, size_t capacity, int64_t* sizes) {
  size_t pos = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const FrameJob& job = jobs[i];
    const size_t payload = job.head_len + job.size;
    if (payload > kMaxRecordPayload || (job.head_len & 3) != 0) {
      sizes[i] = kFrameUnsupported;
      continue;
    }
    const size_t need = framed_record_size(payload);
    // One byte more than stat's size is read: getting it means the file grew.
    if (pos + 8 + payload + 1 > capacity || pos + need > capacity) {
      sizes[i] = kFrameUnsupported;
      continue;
    }
    uint8_t* rec = out + pos;
    uint8_t* image = rec + 8 + job.head_len;
    const long long got = read_file(job.path.c_str(), image, job.size + 1);
    if (got < 0) {
      sizes[i] = kFrameUnreadable;
      continue;
    }
    if (static_cast<size_t>(got) != job.size) {
      sizes[i] = kFrameSizeChanged;
      continue;
    }
    if (!passable_jpeg(image, job.size)) {
      sizes[i] = kFrameNotPassable;
      continue;
    }
    if (job.head_len) std::memcpy(rec + 8, job.head, job.head_len);
    if (has_aligned_magic(rec + 8, payload)) {
      sizes[i] = kFrameSplit;
      continue;
    }
    close_framed_record(rec, payload);
    sizes[i] = static_cast<int64_t>(need);
    pos += need;
  }
  return pos;
}

}  // namespace fastload
