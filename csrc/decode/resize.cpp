// Pixels stage (native): antialiased bilinear resampling of a decoded region into a batch slot.
//
// Why hand-written SIMD kernels rather than libyuv or auto-vectorized loops: libyuv's ARGBScale
// box/bilinear filters neither take a float source box nor match Pillow's support-scaled triangle
// filter (and need ARGB input plus separate flip and NCHW passes), and g++ -O3 does not vectorize
// the horizontal pass (a gather over 3-byte pixels). pmaddwd on (pixel pair x coefficient pair)
// applies two taps to three channels per instruction. Measured on this machine (AMD EPYC, a
// 290x280 region to 224x224, NHWC, flip, coefficient tables included): AVX2 four-row kernel
// 0.09-0.11 ms, SSSE3 four-row kernel 0.17-0.19 ms (a first one-row SSSE3 version: 0.41 ms),
// scalar 1.1-1.8 ms (the machine is shared: ranges over runs). The AVX2 kernel runs four rows
// per pass, two per 256-bit register, so coefficient loads and loop overhead are shared and four
// independent accumulator chains hide the pmaddwd latency; a one-row loop is latency-bound.
// Mean absolute difference to Pillow's Image.resize(BILINEAR, box) on the same decoded pixels:
// 0.004-0.055 (14-bit int16 coefficients vs Pillow's 22-bit int32), at most 2 levels.
// The intermediate rows are packed RGB, the layout of an NHWC slot, so the vertical pass writes
// NHWC rows straight into the slot (no RGBX -> RGB pass, a quarter fewer bytes per vertical pass);
// with output pixels paired in the AVX2 horizontal kernel and the 2/4-tap vertical kernels
// hoisting their coefficients, this cut the resampler's instructions by 43% (callgrind, 100
#include "decode/resize.h"

#include "decode/output.h"
#include "decode/resize_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace fastload {

namespace {

inline double bilinear(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

}  // namespace

namespace {

// Pillow's bicubic filter (libImaging/Resample.c, a = -0.5), support 2.
double pillow_bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// One output pixel's filter: source window [first, first + weights.size()) and its weights.
struct Window {
  int first = 0;
  std::vector<double> weights;
};

// torch's upsample_bicubic2d weights (A = -0.75) for the fraction t, taps at floor(src) - 1 .. + 2.
void torch_cubic_weights(double t, double w[4]) {
  constexpr double A = -0.75;
  auto near = [](double x) { return ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0; };
  auto far = [](double x) { return ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A; };
  w[0] = far(t + 1.0);
  w[1] = near(t);
  w[2] = near(1.0 - t);
  w[3] = far(2.0 - t);
}

// Adds weight w at source index i, clamped into [clip0, clip1), to a window growing to cover it.
void add_clamped(int i, double w, int clip0, int clip1, int* lo, int* hi, double* acc) {
  i = std::max(clip0, std::min(clip1 - 1, i));
  acc[i - *lo] += w;
  *hi = std::max(*hi, i + 1);
}

// The source pixels, counted from the crop's first, of the out_size outputs of nearest, where the
// resized axis starts `rel0` source pixels into the crop (0 for a crop resized whole; left * scale
// for the window of a resized image, whose output pixel x is pixel j0 + x of the resized axis).
// Exact ties between two source pixels (4/7 scales: 224 from 128) are decided the way the
// references' own arithmetic decides them, so whole rows and columns do not land one pixel off:
//   antialias (PIL's NEAREST): Pillow's affine walk, xx = 0.5 * scale, then xx += scale per pixel,
//     truncated;
//   plain (torch's "nearest"): floorf(j * scale) in float32.
void nearest_indices(double rel0, double scale, int out_size, bool antialias, std::vector<int>* idx) {
  idx->resize(out_size);
  long long j0 = 0;
  if (rel0 != 0.0) {
    j0 = std::llround(rel0 / scale);
    if (std::fabs(static_cast<double>(j0) * scale - rel0) > 1e-9 * std::max(1.0, rel0)) {
      // Not a window of a resized axis (no geometry op makes this): the closed form.
      for (int x = 0; x < out_size; ++x)
        (*idx)[x] = static_cast<int>(std::floor(rel0 + (antialias ? x + 0.5 : static_cast<double>(x)) * scale));
      return;
    }
  }
  if (!antialias) {
    const float sf = static_cast<float>(scale);
    for (int x = 0; x < out_size; ++x) (*idx)[x] = static_cast<int>(std::floor(static_cast<float>(j0 + x) * sf));
    return;
  }
  double xx = 0.5 * scale;
  for (long long k = 0; k < j0; ++k) xx += scale;
  for (int x = 0; x < out_size; ++x, xx += scale) (*idx)[x] = static_cast<int>(xx);
}

}  // namespace

void build_axis(double in0, double in1, int in_size, int out_size, AxisTable* t, Interpolation interp, bool antialias,
                int clip0, int clip1) {
  if (clip1 < 0 || clip1 > in_size) clip1 = in_size;
  clip0 = std::max(0, std::min(clip0, clip1 - 1));
  const double scale = (in1 - in0) / out_size;
  t->out_size = out_size;
  t->start.resize(out_size);
  thread_local std::vector<Window> windows;
  if (windows.size() < static_cast<size_t>(out_size)) windows.resize(out_size);
  thread_local std::vector<int> nearest;
  if (interp == Interpolation::kNearest) nearest_indices(in0 - clip0, scale, out_size, antialias, &nearest);
  int max_count = 1;
  for (int xx = 0; xx < out_size; ++xx) {
    Window& win = windows[xx];
    win.weights.clear();
    if (interp == Interpolation::kNearest) {
      win.first = std::max(clip0, std::min(clip1 - 1, nearest[xx] + clip0));
      win.weights.push_back(1.0);
    } else if (antialias) {
      // Pillow's precompute_coeffs: the filter's support grows with the downscale factor, the
      // window is clipped to [clip0, clip1) and the weights renormalized.
      const double filterscale = scale < 1.0 ? 1.0 : scale;
      const double support = (interp == Interpolation::kBicubic ? 2.0 : 1.0) * filterscale;
      const double ss = 1.0 / filterscale;
      const double center = in0 + (xx + 0.5) * scale;
      int xmin = static_cast<int>(center - support + 0.5);
      if (xmin < clip0) xmin = clip0;
      int xmax = static_cast<int>(center + support + 0.5);
      if (xmax > clip1) xmax = clip1;
      win.first = xmin;
      double ww = 0.0;
      for (int x = xmin; x < xmax; ++x) {
        const double d = (x - center + 0.5) * ss;
        const double w = interp == Interpolation::kBicubic ? pillow_bicubic(d) : bilinear(d);
        win.weights.push_back(w);
        ww += w;
      }
      if (win.weights.empty()) win.weights.push_back(0.0);
      if (ww != 0.0)
        for (double& w : win.weights) w /= ww;
    } else {
      // torch's interpolate(align_corners=False) without antialiasing: src = (x + 0.5) * scale - 0.5
      // in the crop; bilinear clamps src at the first pixel and the second tap at the last,
      // bicubic clamps each of its four taps into the crop.
      double src = in0 + (xx + 0.5) * scale - 0.5;
      double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int lo, hi;
      if (interp == Interpolation::kBilinear) {
        if (src < clip0) src = clip0;
        const int i0 = std::min(clip1 - 1, static_cast<int>(std::floor(src)));
        const double lambda = src - i0;
        lo = i0, hi = i0 + 1;
        add_clamped(i0, 1.0 - lambda, clip0, clip1, &lo, &hi, acc);
        add_clamped(i0 + 1, lambda, clip0, clip1, &lo, &hi, acc);
      } else {
        const int i = static_cast<int>(std::floor(src));
        double w[4];
        torch_cubic_weights(src - i, w);
        lo = std::max(clip0, std::min(clip1 - 1, i - 1)), hi = lo + 1;
        for (int k = 0; k < 4; ++k) add_clamped(i - 1 + k, w[k], clip0, clip1, &lo, &hi, acc);
      }
      win.first = lo;
      win.weights.assign(acc, acc + (hi - lo));
    }
    max_count = std::max(max_count, static_cast<int>(win.weights.size()));
  }
  const int taps = max_count <= 2 ? 2 : (max_count + 3) / 4 * 4;
  t->taps = taps;
  t->coef.assign(static_cast<size_t>(out_size) * taps, 0);
  int first = in_size, last = 0;
  for (int xx = 0; xx < out_size; ++xx) {
    const Window& win = windows[xx];
    const int count = static_cast<int>(win.weights.size());
    // Keep every tap inside the image so the padded taps never read past its right edge.
    int shift = 0;
    if (win.first + taps > in_size && in_size >= taps) shift = win.first + taps - in_size;
    t->start[xx] = win.first - shift;
    int16_t* k = &t->coef[static_cast<size_t>(xx) * taps];
    for (int x = 0; x < count; ++x) {
      const double v = win.weights[x];
      k[x + shift] = static_cast<int16_t>(v < 0 ? -0.5 + v * (1 << kCoefBits) : 0.5 + v * (1 << kCoefBits));
    }
    first = std::min(first, t->start[xx]);
    last = std::max(last, std::min(in_size, t->start[xx] + taps));
  }
  t->src_first = std::max(0, first);
  t->src_last = std::max(t->src_first + 1, last);
}

bool build_group_plan(const AxisTable& xt, bool flip, GroupPlan* plan) {
  const int out_w = xt.out_size, taps = xt.taps, pairs = taps / 2;
  // A group's taps must fit the one 64-byte load, which bounds the pairs to 1, 2 or 4.
  if (out_w <= 0 || (pairs != 1 && pairs != 2 && pairs != 4)) return false;
  const int bytes = 3 * out_w;
  const int groups = (bytes + 15) / 16;
  plan->groups = groups, plan->pairs = pairs;
  plan->base.resize(groups);
  plan->index.resize(static_cast<size_t>(groups) * pairs * 64);
  plan->coef.resize(static_cast<size_t>(groups) * pairs * 16);
  // Output byte b of the row is channel b % 3 of output pixel b / 3, whose source column is
  // mirrored under the flip; the tail lanes past the row repeat the last byte's pixel.
  auto column = [&](int b) {
    const int i = std::min(b, bytes - 1) / 3;
    return flip ? out_w - 1 - i : i;
  };
  for (int g = 0; g < groups; ++g) {
    int base = xt.start[column(16 * g)];
    for (int lane = 1; lane < 16; ++lane) base = std::min(base, xt.start[column(16 * g + lane)]);
    plan->base[g] = base;
    uint8_t* index = &plan->index[static_cast<size_t>(g) * pairs * 64];
    int32_t* coef = &plan->coef[static_cast<size_t>(g) * pairs * 16];
    for (int lane = 0; lane < 16; ++lane) {
      const int b = std::min(16 * g + lane, bytes - 1), x = column(16 * g + lane), c = b % 3;
      const int rel = xt.start[x] - base;
      if (3 * (rel + taps - 1) + c >= 64) return false;
      const int16_t* k = &xt.coef[static_cast<size_t>(x) * taps];
      for (int j = 0; j < pairs; ++j) {
        uint8_t* ix = index + 64 * j + 4 * lane;
        ix[0] = static_cast<uint8_t>(3 * (rel + 2 * j) + c);
        ix[1] = 0;
        ix[2] = static_cast<uint8_t>(3 * (rel + 2 * j + 1) + c);
        ix[3] = 0;
        coef[16 * j + lane] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(k[2 * j])) |
                                                   (static_cast<uint32_t>(static_cast<uint16_t>(k[2 * j + 1])) << 16));
      }
    }
  }
  return true;
}

void Resampler::setup(const AxisTable* xt, const AxisTable* yt, bool flip) {
  xt_ = xt, yt_ = yt, flip_ = flip;
  rows_received_ = 0;
  grouped_ = resize_kernels().hgroups != nullptr && build_group_plan(*xt, flip, &plan_);
  // Packed RGB rows: the horizontal kernels' 4- and 8-byte stores need two spare bytes past the
  // last pixel, the grouped kernel stores whole 16-byte groups, the vertical kernels read whole
  // 32-byte chunks.
  tmp_stride_ = (static_cast<size_t>(xt->out_size) * 3 + 2 + 31) / 32 * 32;
  if (grouped_) tmp_stride_ = std::max(tmp_stride_, (static_cast<size_t>(plan_.groups) * 16 + 31) / 32 * 32);
  // Extra rows: the padded vertical taps of the last outputs may point past the needed range
  // (their coefficients are zero, the memory must still exist).
  const size_t rows = static_cast<size_t>(yt->src_last - yt->src_first) + yt->taps + 1;
  if (tmp_.size() < rows * tmp_stride_) tmp_.resize(rows * tmp_stride_);
  if (line_.size() < tmp_stride_ + 32) line_.resize(tmp_stride_ + 32);
  rel_start_.resize(xt->out_size);
}

void Resampler::begin(int x_origin, int /*width*/) {
  x_origin_ = x_origin;
  for (int x = 0; x < xt_->out_size; ++x) rel_start_[x] = xt_->start[x] - x_origin;
}

void Resampler::rows(int y, const uint8_t* const* rgb, int count) {
  const Kernels& kr = resize_kernels();
  int i = 0;
  // Skip rows the vertical pass does not read (the decoder normally sends none).
  while (i < count && y + i < yt_->src_first) ++i;
  int end = count;
  while (end > i && y + end - 1 >= yt_->src_last) --end;
  auto dst_row = [&](int r) { return tmp_.data() + static_cast<size_t>(y + r - yt_->src_first) * tmp_stride_; };
  if (grouped_ && kr.hgroups) {
    while (i < end) {
      const int n = std::min(4, end - i);
      uint8_t* d[4];
      for (int r = 0; r < n; ++r) d[r] = dst_row(i + r);
      kr.hgroups(rgb + i, n, x_origin_, plan_, d);
      rows_received_ += n;
      i += n;
    }
    return;
  }
  if (kr.hpass4) {
    for (; i + 4 <= end; i += 4) {
      uint8_t* d[4] = {dst_row(i), dst_row(i + 1), dst_row(i + 2), dst_row(i + 3)};
      kr.hpass4(rgb + i, rel_start_.data(), xt_->coef.data(), xt_->taps, xt_->out_size, d, flip_);
      rows_received_ += 4;
    }
  }
  for (; i < end; ++i) {
    kr.hpass(rgb[i], rel_start_.data(), xt_->coef.data(), xt_->taps, xt_->out_size, dst_row(i), flip_);
    ++rows_received_;
  }
}

void Resampler::finish(const OutputFormat& out, void* slot, bool vflip) {
  const Kernels& kr = resize_kernels();
  const int out_w = xt_->out_size, out_h = yt_->out_size, taps = yt_->taps;
  const int bytes = out_w * 3;
  const uint8_t* rows[256];
  std::vector<const uint8_t*> many;
  const uint8_t** rp = rows;
  if (taps > 256) {
    many.resize(taps);
    rp = many.data();
  }
  uint8_t* raw = static_cast<uint8_t*>(slot);
  const size_t slot_bytes = static_cast<size_t>(out_h) * bytes;
  // Output rows in ascending memory order (the vertical flip walks the table backwards): the
  // direct NHWC kernel's overrun then always lands in a row written later.
  for (int i = 0; i < out_h; ++i) {
    const int y = vflip ? out_h - 1 - i : i;  // table row; `i` is the output row
    const uint8_t* base = tmp_.data() + static_cast<size_t>(yt_->start[y] - yt_->src_first) * tmp_stride_;
    for (int j = 0; j < taps; ++j) rp[j] = base + static_cast<size_t>(j) * tmp_stride_;
    const int16_t* k = yt_->coef.data() + static_cast<size_t>(y) * taps;
    const size_t at = static_cast<size_t>(i) * bytes;
    if (out.is_raw_nhwc() && at + bytes + 32 <= slot_bytes) {
      // uint8 NHWC rows are packed RGB like the intermediate: the vertical pass writes the slot
      // directly. Its chunked stores run up to 31 bytes past the row, into rows written later;
      // only where that would leave the slot (another image's, maybe another thread's) does it go
      // through line_.
      kr.vpass(rp, k, taps, bytes, raw + at);
    } else {
      // Every other format: the row goes through line_ (in L1) and the output stage writes it in
      // the final dtype and layout, normalized: the fused float write, no second pass.
      kr.vpass(rp, k, taps, bytes, line_.data());
      write_output_row(out, line_.data(), i, slot);
    }
  }
}

}  // namespace fastload
