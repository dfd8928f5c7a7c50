// Restart-indexed JPEGs, decode-time half: interval slicing. See restart_slice.h.
#include "decode/restart_slice.h"

#include <atomic>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fastload {
namespace {

// ---- header parsing for slicing -------------------------------------------------------------

struct Segment {
  size_t start;  // offset of the marker's 0xFF
  size_t end;    // one past the segment's last byte
};

struct ParsedHeaders {
  RestartGeometry geo;
  Segment keep[64];  // segments a decoder of the slice needs, in file order
  int n_keep = 0;
  int sof_index = -1;     // which kept segment is the SOF
  size_t scan_start = 0;  // first entropy-coded byte
};

inline int be16(const uint8_t* p) { return (p[0] << 8) | p[1]; }

bool fail(std::string* why, const char* fmt, long a = 0, long b = 0, long c = 0) {
  if (why != nullptr) {
    char buf[200];
    std::snprintf(buf, sizeof buf, fmt, a, b, c);
    *why = buf;
  }
  return false;
}

// ---- entropy-data scan ------------------------------------------------------------------------
// The slicer walks every 0xFF of the entropy data: restart markers (one per interval, about every
// 100 bytes on ImageNet-like images with one-MCU intervals) and stuffed data bytes (0xFF 0x00,
// about a third of them). Stopping at each with memchr made the scan a quarter of a small crop's
// whole decode; the AVX-512 walk tests 64 bytes and their successors at once, never stops at
// stuffed bytes and records plain RSTn markers without leaving the block (restart_slice() of a
// 8x8 crop, ImageNet-like images: 17.5 us per image with memchr, 8.0 us with this walk).
// Anything else (fill bytes, EOI, stray markers, the last 64 bytes) takes the one scalar step both
// paths share, so they accept and refuse exactly the same inputs with the same messages.

class IntervalScan {
 public:
  IntervalScan(const uint8_t* data, size_t size, long total, uint32_t* bounds, std::string* why)
      : data_(data), size_(size), total_(total), bounds_(bounds), why_(why) {}

  enum Step { kMore, kDone, kFailed };

  // An RSTn marker: the interval ends at `end` (its first 0xFF, fill bytes included), the marker
  // byte m is at `at` and the next interval starts after it.
  Step restart(size_t end, size_t at, int m) {
    if (idx_ + 1 >= total_)
      return failed("more restart markers than the %ld intervals DRI and the frame imply", total_);
    if (m - 0xD0 != idx_ % 8)
      return failed("restart marker RST%ld where RST%ld was due (interval %ld)", m - 0xD0, idx_ % 8, idx_);
    bounds_[2 * idx_ + 1] = static_cast<uint32_t>(end);
    ++idx_;
    bounds_[2 * idx_] = static_cast<uint32_t>(at + 1);
    return kMore;
  }

  // The general case at a 0xFF at `run` (run < size): fill bytes, stuffing, RSTn, EOI or a stray
  // marker. Sets *next to where scanning resumes.
  Step step(size_t run, size_t* next) {
    size_t q = run + 1;
    while (q < size_ && data_[q] == 0xFF) ++q;  // fill bytes before a marker
    if (q >= size_) return truncated();
    const int m = data_[q];
    *next = q + 1;
    if (m == 0x00) return kMore;  // stuffed 0xFF data byte
    if (m >= 0xD0 && m <= 0xD7) return restart(run, q, m);
    if (m != 0xD9) return failed("marker 0x%02lX inside or after the scan (expected EOI)", m);
    bounds_[2 * idx_ + 1] = static_cast<uint32_t>(run);
    ++idx_;
    return kDone;
  }

  Step truncated() { return failed("entropy data truncated (no EOI) after interval %ld of %ld", idx_, total_); }

  // Scalar walk from p to the end.
  Step scalar(size_t p) {
    for (;;) {
      const void* hit = p < size_ ? std::memchr(data_ + p, 0xFF, size_ - p) : nullptr;
      if (hit == nullptr) return truncated();
      const Step st = step(static_cast<size_t>(static_cast<const uint8_t*>(hit) - data_), &p);
      if (st != kMore) return st;
    }
  }

  long count() const { return idx_; }

 private:
  Step failed(const char* fmt, long a = 0, long b = 0, long c = 0) {
    fail(why_, fmt, a, b, c);
    return kFailed;
  }

  const uint8_t* data_;
  size_t size_;
  long total_;
  uint32_t* bounds_;
  std::string* why_;
  long idx_ = 0;
};

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512bw,bmi"))) IntervalScan::Step scan_avx512(IntervalScan& sc, const uint8_t* data,
                                                                               size_t p, size_t size) {
  const __m512i ff = _mm512_set1_epi8(static_cast<char>(0xFF));
  const __m512i zero = _mm512_setzero_si512();
  // Each block reads 65 bytes (64 and the byte after them); the tail goes to the scalar walk.
  while (p + 65 <= size) {
    const __mmask64 is_ff = _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(data + p), ff);
    __mmask64 hits = is_ff == 0 ? 0 : is_ff & _mm512_cmpneq_epi8_mask(_mm512_loadu_si512(data + p + 1), zero);
    size_t next = p + 64;
    while (hits != 0) {
      const size_t run = p + static_cast<size_t>(_tzcnt_u64(hits));
      const int m = data[run + 1];
      if (m >= 0xD0 && m <= 0xD7) {
        if (sc.restart(run, run + 1, m) != IntervalScan::kMore) return IntervalScan::kFailed;
        hits &= hits - 1;
        continue;
      }
      const IntervalScan::Step st = sc.step(run, &next);
      if (st != IntervalScan::kMore) return st;
      break;  // resume the blocks at `next`
    }
    p = next;
  }
  return sc.scalar(p);
}

bool cpu_has_avx512bw() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi");
}
#endif

std::atomic<bool> g_scalar_scan{false};

// Finds where each of the `total` restart intervals starts and ends (bounds[2i], bounds[2i + 1]),
// checking the RSTn numbering and that exactly `total` intervals end at EOI.
bool scan_intervals(const uint8_t* data, size_t size, size_t scan_start, long total, uint32_t* bounds,
                    std::string* why) {
  IntervalScan sc(data, size, total, bounds, why);
  bounds[0] = static_cast<uint32_t>(scan_start);
  IntervalScan::Step st;
#if defined(__x86_64__) || defined(__i386__)
  static const bool wide = cpu_has_avx512bw();
  st = wide && !g_scalar_scan.load(std::memory_order_relaxed) ? scan_avx512(sc, data, scan_start, size)
                                                              : sc.scalar(scan_start);
#else
  st = sc.scalar(scan_start);
#endif
  if (st != IntervalScan::kDone) return false;
  if (sc.count() != total)
    return fail(why, "found %ld restart intervals, DRI and the frame imply %ld", sc.count(), total);
  return true;
}

bool parse_headers(const uint8_t* data, size_t size, ParsedHeaders* ph, std::string* why) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return fail(why, "not a JPEG (no SOI marker)");
  size_t p = 2;
  bool have_sof = false;
  int restart_interval = 0;
  int width = 0, height = 0, ncomp = 0;
  int h_samp[4] = {1, 1, 1, 1}, v_samp[4] = {1, 1, 1, 1};
  for (;;) {
    if (p >= size) return fail(why, "headers truncated before the scan");
    if (data[p] != 0xFF) return fail(why, "expected a marker at byte %ld", static_cast<long>(p));
    while (p < size && data[p] == 0xFF) ++p;  // fill bytes
    if (p >= size) return fail(why, "headers truncated before the scan");
    const int marker = data[p];
    const size_t start = p - 1;
    ++p;
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length field
    if (marker == 0xD9) return fail(why, "EOI before any scan");
    if (p + 2 > size) return fail(why, "headers truncated before the scan");
    const int len = be16(data + p);
    if (len < 2 || p + len > size) return fail(why, "marker 0x%02lX segment runs past the end", marker);
    const uint8_t* body = data + p + 2;
    const int body_len = len - 2;
    const size_t end = p + len;
    bool keep = true;
    if (marker == 0xC0 || marker == 0xC1) {
      if (have_sof) return fail(why, "two SOF markers");
      if (body_len < 6) return fail(why, "SOF segment too short");
      if (body[0] != 8) return fail(why, "%ld-bit samples are not sliceable", body[0]);
      height = be16(body + 1);
      width = be16(body + 3);
      ncomp = body[5];
      if (height == 0) return fail(why, "height given by a DNL marker is not sliceable");
      if (width == 0) return fail(why, "zero image width");
      if (ncomp < 1 || ncomp > 4) return fail(why, "%ld components are not sliceable", ncomp);
      if (body_len < 6 + 3 * ncomp) return fail(why, "SOF segment too short");
      for (int c = 0; c < ncomp; ++c) {
        h_samp[c] = body[6 + 3 * c + 1] >> 4;
        v_samp[c] = body[6 + 3 * c + 1] & 15;
        if (h_samp[c] < 1 || h_samp[c] > 4 || v_samp[c] < 1 || v_samp[c] > 4)
          return fail(why, "invalid sampling factors");
      }
      have_sof = true;
      ph->sof_index = ph->n_keep;
    } else if ((marker >= 0xC2 && marker <= 0xCF) && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      return fail(why, "SOF%ld (progressive, lossless or arithmetic) is not sliceable", marker - 0xC0);
    } else if (marker == 0xDD) {
      if (body_len < 2) return fail(why, "DRI segment too short");
      restart_interval = be16(body);
    } else if (marker == 0xDA) {
      if (!have_sof) return fail(why, "SOS before SOF");
      if (body_len < 1 || body[0] != ncomp)
        return fail(why, "the first scan holds %ld of %ld components (multi-scan files are not sliceable)",
                    body_len < 1 ? 0 : body[0], ncomp);
      if (body_len < 1 + 2 * ncomp + 3) return fail(why, "SOS segment too short");
      const uint8_t* tail = body + 1 + 2 * ncomp;  // Ss, Se, Ah/Al
      if (tail[0] != 0 || tail[1] != 63 || tail[2] != 0) return fail(why, "not a sequential DCT scan");
      if (ph->n_keep >= 64) return fail(why, "too many header segments");
      ph->keep[ph->n_keep++] = Segment{start, end};
      ph->scan_start = end;
      break;
    } else if (marker == 0xE0) {
      keep = body_len >= 5 && std::memcmp(body, "JFIF\0", 5) == 0;  // colour-space hint
    } else if (marker == 0xEE) {
      keep = body_len >= 5 && std::memcmp(body, "Adobe", 5) == 0;  // colour transform flag
    } else if ((marker >= 0xE1 && marker <= 0xEF) || marker == 0xFE) {
      keep = false;  // EXIF, ICC, XMP, comments: metadata a pixel decoder of the slice never reads
    }
    if (keep) {
      if (ph->n_keep >= 64) return fail(why, "too many header segments");
      ph->keep[ph->n_keep++] = Segment{start, end};
    }
    p = end;
  }
  fill_geometry(width, height, ncomp, h_samp, v_samp, restart_interval, &ph->geo);
  return true;
}

}  // namespace

void restart_force_scalar_scan(bool scalar) { g_scalar_scan.store(scalar); }

bool parse_restart_geometry(const uint8_t* data, size_t size, RestartGeometry* geo, std::string* why) {
  ParsedHeaders ph;
  if (!parse_headers(data, size, &ph, why)) return false;
  *geo = ph.geo;
  return true;
}

namespace {

// Copies the entropy bytes [p, e) of one interval to w without stuffing; returns the new end. The
// scan has checked that every 0xFF run inside an interval ends with 0x00: fill bytes and the zero
// go, one 0xFF data byte stays (what libjpeg's bit reader makes of it).
uint8_t* unstuff(const uint8_t* p, const uint8_t* e, uint8_t* w) {
  while (p < e) {
    const void* hit = std::memchr(p, 0xFF, static_cast<size_t>(e - p));
    const uint8_t* ff = hit != nullptr ? static_cast<const uint8_t*>(hit) : e;
    std::memcpy(w, p, static_cast<size_t>(ff - p));
    w += ff - p;
    if (ff == e) break;
    *w++ = 0xFF;
    p = ff + 1;
    while (p < e && *p == 0xFF) ++p;
    if (p < e) ++p;
  }
  return w;
}

}  // namespace

bool build_restart_slice(const uint8_t* data, size_t size, int crop_x, int crop_y, int crop_w, int crop_h,
                         RestartSlice* out, std::string* why, int scale_denom, bool separate_entropy) {
  out->claimed = RestartGeometry();
  if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8)
    return fail(why, "scale_denom %ld is not 1, 2, 4 or 8", scale_denom);
  if (size >= (static_cast<size_t>(1) << 32)) return fail(why, "image larger than 4 GiB");
  ParsedHeaders ph;
  if (!parse_headers(data, size, &ph, why)) return false;
  out->claimed = ph.geo;
  const RestartGeometry& g = ph.geo;
  if (g.restart_interval == 0) return fail(why, "no restart interval (DRI)");
  if (g.intervals_per_row == 0)
    return fail(why, "restart interval %ld does not divide the MCU row width %ld", g.restart_interval, g.mcus_per_row);
  if (crop_w <= 0 || crop_h <= 0 || crop_x < 0 || crop_y < 0 || static_cast<long>(crop_x) + crop_w > g.width ||
      static_cast<long>(crop_y) + crop_h > g.height)
    return fail(why, "crop lies outside the %ldx%ld image", g.width, g.height);

  // One scan over the entropy data: where each interval starts and ends. The count and the RSTn
  // numbering must be exactly what DRI and the frame size imply, or the geometry is a lie.
  const long total = static_cast<long>(g.mcu_rows) * g.intervals_per_row;
  // Every interval but the last ends with a 2-byte marker and holds at least one byte: a header
  // claiming more intervals than that is a lie, refused before the offset table is allocated.
  if (total > static_cast<long>(size / 3) + 1)
    return fail(why, "the frame claims %ld restart intervals, more than %ld bytes can hold", total,
                static_cast<long>(size));
  std::vector<uint32_t>& bounds = out->scratch;
  bounds.resize(2 * static_cast<size_t>(total));
  if (!scan_intervals(data, size, ph.scan_start, total, bounds.data(), why)) return false;

  // The decoder outputs scaled pixels [floor(x / d), ceil((x + w) / d)); in full-size pixels that
  // is [sx0, sx1), which is what must come out identical. Scaled MCU boundaries are the full-size
  // ones divided by d (the MCU size is a multiple of 8, d <= 8).
  const int d = scale_denom;
  const int sx0 = (crop_x / d) * d, sy0 = (crop_y / d) * d;
  const int sx1 = (crop_x + crop_w + d - 1) / d * d, sy1 = (crop_y + crop_h + d - 1) / d * d;
  int mx0 = sx0 / g.mcu_width;
  int mx1 = (sx1 + g.mcu_width - 1) / g.mcu_width;
  int my0 = sy0 / g.mcu_height;
  int my1 = (sy1 + g.mcu_height - 1) / g.mcu_height;
  if (mx1 > g.mcus_per_row) mx1 = g.mcus_per_row;
  if (my1 > g.mcu_rows) my1 = g.mcu_rows;
  // Pad by one MCU where an output edge is an MCU boundary in a subsampled direction: fancy
  // upsampling reads the neighbouring chroma sample, which a slice edge would replicate instead.
  if (g.subsampled_x) {
    if (sx0 % g.mcu_width == 0 && mx0 > 0) --mx0;
    if (sx1 % g.mcu_width == 0 && mx1 < g.mcus_per_row) ++mx1;
  }
  if (g.subsampled_y) {
    if (sy0 % g.mcu_height == 0 && my0 > 0) --my0;
    if (sy1 % g.mcu_height == 0 && my1 < g.mcu_rows) ++my1;
  }
  const int n = g.restart_interval;
  int c0 = mx0 / n;
  int c1 = (mx1 + n - 1) / n;  // interval columns [c0, c1)
  int x_end = c1 * n * g.mcu_width < g.width ? c1 * n * g.mcu_width : g.width;
  // libjpeg switches h2v1/h2v2 fancy upsampling off (plain replication) when a component is at
  // most 2 samples wide, i.e. an output at most 4 pixels wide. Only the last, partial interval
  // column can make such a narrow slice; widen it so its decoder upsamples as the full image's does.
  if (g.subsampled_x && (x_end - c0 * n * g.mcu_width + d - 1) / d <= 4) {
    if (c0 > 0)
      --c0;
    else if (c1 < g.intervals_per_row)
      ++c1;
    x_end = c1 * n * g.mcu_width < g.width ? c1 * n * g.mcu_width : g.width;
  }
  out->x0 = c0 * n * g.mcu_width;
  out->y0 = my0 * g.mcu_height;
  const int y_end = my1 * g.mcu_height < g.height ? my1 * g.mcu_height : g.height;
  out->width = x_end - out->x0;
  out->height = y_end - out->y0;
  out->intervals = (c1 - c0) * (my1 - my0);

  size_t need = 2 + 2, intervals_bytes = 0;
  for (int s = 0; s < ph.n_keep; ++s) need += ph.keep[s].end - ph.keep[s].start;
  for (int r = my0; r < my1; ++r) {
    const long first = static_cast<long>(r) * g.intervals_per_row + c0;
    const long last = static_cast<long>(r) * g.intervals_per_row + c1 - 1;
    intervals_bytes += bounds[2 * last + 1] - bounds[2 * first] + 2 * (c1 - c0);  // upper bound incl. markers
  }
  if (!separate_entropy) need += intervals_bytes;
  std::vector<uint8_t>& o = out->jpeg;
  o.resize(need);
  uint8_t* w = o.data();
  *w++ = 0xFF;
  *w++ = 0xD8;
  for (int s = 0; s < ph.n_keep; ++s) {
    const size_t len = ph.keep[s].end - ph.keep[s].start;
    std::memcpy(w, data + ph.keep[s].start, len);
    if (s == ph.sof_index) {
      // FF Cn Lh Ll P Yh Yl Xh Xl: the frame size becomes the slice's.
      w[5] = static_cast<uint8_t>(out->height >> 8);
      w[6] = static_cast<uint8_t>(out->height & 0xFF);
      w[7] = static_cast<uint8_t>(out->width >> 8);
      w[8] = static_cast<uint8_t>(out->width & 0xFF);
    }
    w += len;
  }
  if (separate_entropy) {
    SliceEntropy& en = out->entropy;
    en.bytes.resize(intervals_bytes + kSliceEntropyPad);
    en.offsets.resize(static_cast<size_t>(out->intervals) + 1);
    uint8_t* e = en.bytes.data();
    size_t k = 0;
    for (int r = my0; r < my1; ++r) {
      for (int c = c0; c < c1; ++c) {
        const long i = static_cast<long>(r) * g.intervals_per_row + c;
        en.offsets[k++] = static_cast<uint32_t>(e - en.bytes.data());
        e = unstuff(data + bounds[2 * i], data + bounds[2 * i + 1], e);
      }
    }
    en.offsets[k] = static_cast<uint32_t>(e - en.bytes.data());
    *w++ = 0xFF;
    *w++ = 0xD9;
    o.resize(static_cast<size_t>(w - o.data()));
    return true;
  }
  long k = 0;  // intervals written so far: the slice renumbers RST0..RST7 from 0
  for (int r = my0; r < my1; ++r) {
    for (int c = c0; c < c1; ++c) {
      if (k > 0) {
        *w++ = 0xFF;
        *w++ = static_cast<uint8_t>(0xD0 + ((k - 1) & 7));
      }
      const long i = static_cast<long>(r) * g.intervals_per_row + c;
      const size_t len = bounds[2 * i + 1] - bounds[2 * i];
      std::memcpy(w, data + bounds[2 * i], len);
      w += len;
      ++k;
    }
  }
  *w++ = 0xFF;
  *w++ = 0xD9;
  o.resize(static_cast<size_t>(w - o.data()));
  return true;
}

}  // namespace fastload
