// Pixels stage (native): the one-pass warp resampler (see warp.h).
#include "warp/warp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace fastload {

Affine2 compose(const Affine2& o, const Affine2& i) {
  Affine2 r;
  r.a = o.a * i.a + o.b * i.d;
  r.b = o.a * i.b + o.b * i.e;
  r.c = o.a * i.c + o.b * i.f + o.c;
  r.d = o.d * i.a + o.e * i.d;
  r.e = o.d * i.b + o.e * i.e;
  r.f = o.d * i.c + o.e * i.f + o.f;
  return r;
}

namespace {

constexpr double kPi = 3.14159265358979323846;

inline double kernel_radius(WarpKernel k) {
  switch (k) {
    case WarpKernel::kLinear: return 1.0;
    case WarpKernel::kCubic:
    case WarpKernel::kCubicCv: return 2.0;
    case WarpKernel::kLanczos4: return 4.0;
    default: return 0.0;
  }
}

inline double cubic(double d, double a) {
  d = std::fabs(d);
  if (d < 1.0) return ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0;
  if (d < 2.0) return ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a;
  return 0.0;
}

inline double lanczos4(double d) {
  if (std::fabs(d) < 1e-12) return 1.0;
  if (std::fabs(d) >= 4.0) return 0.0;
  return std::sin(kPi * d) * std::sin(kPi * d / 4.0) / (kPi * kPi * d * d / 4.0);
}

inline double kernel_value(WarpKernel k, double d) {
  switch (k) {
    case WarpKernel::kLinear: return std::max(0.0, 1.0 - std::fabs(d));
    case WarpKernel::kCubic: return cubic(d, -0.5);
    case WarpKernel::kCubicCv: return cubic(d, -0.75);
    case WarpKernel::kLanczos4: return lanczos4(d);
    default: return 0.0;
  }
}

// floor() for |v| < 2^31 without a libm call (the baseline x86-64 target has no roundsd).
inline int ifloor(double v) {
  const int i = static_cast<int>(v);
  return i - (v < static_cast<double>(i) ? 1 : 0);
}

// Positions beyond a million pixels only occur in degenerate plans (no frame, huge maps): they are
// clamped there (the taps read the border anyway), which keeps every later int conversion in range
// (positions times 1024 are OpenCV's fixed point).
constexpr double kMaxPosition = 1e6;
inline double clamp_position(double v) {
  return v < -kMaxPosition ? -kMaxPosition : (v > kMaxPosition ? kMaxPosition : v);
}

// nearbyint() under the default rounding mode (ties to even) for |v| < 2^51, without a libm call.
inline double round_even(double v) {
  const double magic = 6755399441055744.0;  // 1.5 * 2^52
  return (v + magic) - magic;
}

inline double floor_shift(long long v, int bits) {
  // Arithmetic shift right: floor division by 2^bits, negative values included.
  return static_cast<double>(v >> bits);
}

constexpr int kPhaseBits = 8;  // positions to 1/256 pixel (warp.py's PHASES)
constexpr int kPhases = 1 << kPhaseBits;
constexpr int kWeightBits = 14;  // fixed-point weights of the tabulated kernels (warp.py's WEIGHT_BITS)

inline void normalise(double* w, int count) {
  double total = w[0];
  for (int t = 1; t < count; ++t) total += w[t];
  const double inv = 1.0 / (total == 0.0 ? 1.0 : total);
  for (int t = 0; t < count; ++t) w[t] *= inv;
}

inline int32_t fixed_weight(double w) { return static_cast<int32_t>(std::floor(w * (1 << kWeightBits) + 0.5)); }

// One axis of a plan at a given DCT scale: the NEAREST shift, or the kernel tabulated by phase
// (warp.py's _phase_taps): for a position u = k + phase / 256, taps k + off[phase] ... + count - 1.
struct Axis {
  WarpKernel kernel;
  double scale;             // source pixels (at this scale) per output pixel
  double fs;                // filter widening
  double support;           // tap radius in source pixels (for the source rectangle)
  double shift;             // NEAREST shift
  int count = 1;            // taps per position
  bool fixed2 = false;      // plain bilinear (the integer path, no table)
  int size;                 // image size along the axis (at this scale)
  bool drop;                // DROP border: renormalise over the taps inside the image
  std::vector<int> off;     // per phase: first tap relative to the position's pixel
  std::vector<double> wd;   // per phase: count double weights (DROP renormalises these)
  std::vector<int32_t> wi;  // per phase: count fixed-point weights

  Axis(const WarpPlan& p, bool x, int denom, int image_size, bool tables) {
    kernel = p.kernel;
    scale = (x ? p.scale_x : p.scale_y) / denom;
    shift = (x ? p.shift_x : p.shift_y) / denom;
    fs = p.antialias && kernel != WarpKernel::kNearest && kernel != WarpKernel::kArea ? std::max(1.0, scale) : 1.0;
    size = image_size;
    drop = p.border == WarpBorder::kDrop;
    const bool plain =
        fs == 1.0 && (kernel == WarpKernel::kLinear || kernel == WarpKernel::kCubic || kernel == WarpKernel::kCubicCv);
    if (kernel == WarpKernel::kNearest) {
      support = 0.0, count = 1;
    } else if (kernel == WarpKernel::kArea) {
      support = scale / 2.0, count = static_cast<int>(std::ceil(scale)) + 1;
    } else if (plain) {
      support = kernel_radius(kernel), count = kernel == WarpKernel::kLinear ? 2 : 4;
      fixed2 = kernel == WarpKernel::kLinear;
    } else {
      support = kernel_radius(kernel) * fs, count = static_cast<int>(std::ceil(2.0 * support));
    }
    if (!tables || kernel == WarpKernel::kNearest) return;
    off.resize(kPhases), wd.resize(static_cast<size_t>(kPhases) * count), wi.resize(wd.size());
    for (int ph = 0; ph < kPhases; ++ph) {
      const double phase = static_cast<double>(ph) / kPhases;
      double* w = &wd[static_cast<size_t>(ph) * count];
      if (kernel == WarpKernel::kArea) {
        const double lo = phase - scale / 2.0, hi = phase + scale / 2.0;
        off[ph] = static_cast<int>(std::floor(lo));
        for (int t = 0; t < count; ++t) {
          const double j = static_cast<double>(off[ph] + t);
          w[t] = std::max(0.0, std::min(j + 1.0, hi) - std::max(j, lo));
        }
        normalise(w, count);
      } else if (plain) {
        const double base = std::floor(phase - 0.5), f = (phase - 0.5) - base;
        if (kernel == WarpKernel::kLinear) {
          off[ph] = static_cast<int>(base), w[0] = 1.0 - f, w[1] = f;
        } else {
          const double a = kernel == WarpKernel::kCubic ? -0.5 : -0.75;
          off[ph] = static_cast<int>(base) - 1;
          w[0] = cubic(f + 1.0, a), w[1] = cubic(f, a), w[2] = cubic(1.0 - f, a);
          w[3] = ((1.0 - w[0]) - w[1]) - w[2];
        }
      } else {
        const double first = std::floor(phase - support + 0.5), end = std::floor(phase + support + 0.5);
        off[ph] = static_cast<int>(first);
        for (int t = 0; t < count; ++t)
          w[t] = first + t < end ? kernel_value(kernel, (first + t + 0.5 - phase) * (1.0 / fs)) : 0.0;
        normalise(w, count);
      }
      for (int t = 0; t < count; ++t) wi[static_cast<size_t>(ph) * count + t] = fixed_weight(w[t]);
    }
  }

  // Taps of position u (scaled pixels): returns the first tap, *w the fixed-point weights. DROP
  // positions with taps outside the image get their double weights renormalised (in d, count
  // doubles) into tmp.
  int taps(double u, const int32_t** w, int32_t* tmp, double* d) const {
    const int q = ifloor(u * kPhases + 0.5);
    const int ph = q & (kPhases - 1);
    const int first = (q >> kPhaseBits) + off[ph];
    *w = &wi[static_cast<size_t>(ph) * count];
    if (drop && (first < 0 || first + count > size)) {
      for (int t = 0; t < count; ++t) {
        const int j = first + t;
        d[t] = (j < 0 || j >= size) ? 0.0 : wd[static_cast<size_t>(ph) * count + t];
      }
      normalise(d, count);
      for (int t = 0; t < count; ++t) tmp[t] = fixed_weight(d[t]);
      *w = tmp;
    }
    return first;
  }
};

// Output pixel -> source position, with the plan's constants hoisted out of the pixel loop. The
// arithmetic is warp.py's: maps as a x + (b y + c); quantised positions as cv::warpAffine. When
// to_frame is axis-aligned (MXNet's plans: crops, scaling, mirror), the frame point's x depends on
// the column only and y on the row only, so every term is tabulated once per column and per row
// and a pixel costs two additions (the same values: the terms are the ones the formula adds).
struct Mapper {
  const WarpPlan& p;
  double inv;  // 1 / denom: full-resolution -> scaled source pixels
  bool clamp;  // the plan's positions may leave int range (degenerate plans only)
  double b0 = 0, b1 = 0;
  long long delta = 0;
  bool nearest;
  bool separable;
  bool grid;  // separable and to_source axis-aligned too: u depends on the column only, v on the row only
  // Separable plans: per column (x terms) and per row (y terms); `ok` marks frame points inside.
  std::vector<double>& cu;
  std::vector<double>& cv;
  std::vector<long long>& cqx;
  std::vector<long long>& cqy;
  std::vector<uint8_t>& cok;

  // Row state set by row().
  struct Row {
    double rx = 0, ry = 0;  // to_frame's b y + c parts (general plans)
    bool ok = true;         // separable: the row's frame point y is inside the frame
    double ru = 0, rv = 0;  // separable: the y terms of u and v
    long long rqx = 0, rqy = 0;
  };

  Mapper(const WarpPlan& plan, int denom, bool may_overflow, WarpScratch* s)
      : p(plan), inv(1.0 / denom), clamp(may_overflow), cu(s->cu), cv(s->cv), cqx(s->cqx), cqy(s->cqy), cok(s->cok) {
    nearest = p.kernel == WarpKernel::kNearest;
    if (p.quantize) {
      // The same map in OpenCV's centred coordinates: p_src - 0.5 = A (p - 0.5) + b.
      const Affine2& m = p.to_source;
      b0 = m.c + 0.5 * (m.a + m.b) - 0.5, b1 = m.f + 0.5 * (m.d + m.e) - 0.5;
      delta = nearest ? 512 : 16;  // cv::warpAffine's round_delta
    }
    separable = !clamp && p.to_frame.b == 0.0 && p.to_frame.d == 0.0;
    grid = separable && p.to_source.b == 0.0 && p.to_source.d == 0.0;
    if (!separable) return;
    cu.resize(p.out_w), cv.resize(p.out_w), cqx.resize(p.out_w), cqy.resize(p.out_w), cok.resize(p.out_w);
    const Affine2& m = p.to_source;
    const double rx = p.to_frame.b * 0.5 + p.to_frame.c;  // b == 0: the same for every row
    for (int x = 0; x < p.out_w; ++x) {
      double fx = p.to_frame.a * (x + 0.5) + rx;
      cok[x] = !p.has_frame || (fx >= p.frame[0] && fx < p.frame[2]);
      if (!cok[x]) fx = 0.0;  // a fill column: its terms are never used
      if (p.snap) fx = ifloor(fx) + 0.5;
      if (p.quantize) {
        const double qx = fx - 0.5;
        cqx[x] = static_cast<long long>(round_even(m.a * qx * 1024.0));
        cqy[x] = static_cast<long long>(round_even(m.d * qx * 1024.0));
      } else {
        cu[x] = m.a * fx, cv[x] = m.d * fx;
      }
    }
  }

  void row(int y, Row* r) const {
    const double py = y + 0.5;
    r->rx = p.to_frame.b * py + p.to_frame.c;
    r->ry = p.to_frame.e * py + p.to_frame.f;
    if (!separable) return;
    double fy = p.to_frame.d * 0.5 + r->ry;  // d == 0: the same for every column
    r->ok = !p.has_frame || (fy >= p.frame[1] && fy < p.frame[3]);
    if (!r->ok) return;
    if (p.snap) fy = ifloor(fy) + 0.5;
    const Affine2& m = p.to_source;
    if (p.quantize) {
      const double qy = fy - 0.5;
      r->rqx = static_cast<long long>(round_even((m.b * qy + b0) * 1024.0)) + delta;
      r->rqy = static_cast<long long>(round_even((m.e * qy + b1) * 1024.0)) + delta;
    } else {
      r->ru = m.b * fy + m.c, r->rv = m.e * fy + m.f;
    }
  }

  // Source position (scaled pixels) of output column x of the row; false when the frame point is
  // outside the frame (the pixel is fill).
  bool operator()(int x, const Row& r, double* u, double* v) const {
    if (separable) {
      if (!r.ok || !cok[x]) return false;
      if (p.quantize) {
        quantised(cqx[x] + r.rqx, cqy[x] + r.rqy, u, v);
      } else {
        *u = cu[x] + r.ru, *v = cv[x] + r.rv;
      }
      *u *= inv, *v *= inv;
      return true;
    }
    const double px = x + 0.5;
    double fx = p.to_frame.a * px + r.rx;
    double fy = p.to_frame.d * px + r.ry;
    if (p.has_frame && !(fx >= p.frame[0] && fx < p.frame[2] && fy >= p.frame[1] && fy < p.frame[3])) return false;
    if (clamp) fx = clamp_position(fx), fy = clamp_position(fy);
    if (p.snap) fx = ifloor(fx) + 0.5, fy = ifloor(fy) + 0.5;
    const Affine2& m = p.to_source;
    if (p.quantize) {
      // 10 fractional bits (cvRound: ties to even), then INTER_BITS = 5 or the nearest pixel.
      const double qx = fx - 0.5, qy = fy - 0.5;
      double ax = m.a * qx * 1024.0, bx = (m.b * qy + b0) * 1024.0;
      double ay = m.d * qx * 1024.0, by = (m.e * qy + b1) * 1024.0;
      if (clamp) ax = clamp_position(ax), bx = clamp_position(bx), ay = clamp_position(ay), by = clamp_position(by);
      quantised(static_cast<long long>(round_even(ax)) + (static_cast<long long>(round_even(bx)) + delta),
                static_cast<long long>(round_even(ay)) + (static_cast<long long>(round_even(by)) + delta), u, v);
    } else {
      *u = m.a * fx + (m.b * fy + m.c);
      *v = m.d * fx + (m.e * fy + m.f);
    }
    *u *= inv, *v *= inv;
    if (clamp) *u = clamp_position(*u), *v = clamp_position(*v);
    return true;
  }

  // Grid plans: the column's u and the row's v (scaled pixels), the values operator() gives for
  // every pixel of that column / row (the other axis enters only through terms multiplied by 0).
  double grid_u(int x) const {
    const Affine2& m = p.to_source;
    double u, v;
    if (p.quantize) {
      quantised(cqx[x] + (static_cast<long long>(round_even(b0 * 1024.0)) + delta), 0, &u, &v);
    } else {
      u = cu[x] + m.c;
    }
    return u * inv;
  }
  double grid_v(const Row& r) const {
    double u, v;
    if (p.quantize) {
      quantised(0, r.rqy, &u, &v);  // cqy[x] = round(0 * qx * 1024) = 0
    } else {
      v = 0.0 + r.rv;
    }
    return v * inv;
  }

  void quantised(long long big_x, long long big_y, double* u, double* v) const {
    if (nearest) {
      *u = floor_shift(big_x, 10) + 0.5, *v = floor_shift(big_y, 10) + 0.5;
    } else {
      *u = floor_shift(big_x, 5) / 32.0 + 0.5, *v = floor_shift(big_y, 5) / 32.0 + 0.5;
    }
  }
};

inline uint8_t round_clip(double v) {
  const double r = v + 0.5;
  if (!(r >= 1.0)) return 0;  // also NaN
  if (r >= 255.0) return 255;
  return static_cast<uint8_t>(static_cast<int>(r));
}

// The pixel at (jx, jy) of the scaled image: from the region (clamped to it, defensively), the
// edge pixel (REPLICATE, DROP) or nullptr for `fill` (CONSTANT) when outside the image.
inline const uint8_t* pixel_at(const WarpPlan& p, const SourceRegion& src, int jx, int jy) {
  if (jx < 0 || jx >= src.image_w || jy < 0 || jy >= src.image_h) {
    if (p.border == WarpBorder::kConstant) return nullptr;
    jx = std::min(std::max(jx, 0), src.image_w - 1), jy = std::min(std::max(jy, 0), src.image_h - 1);
  }
  jx = std::min(std::max(jx, src.x0), src.x0 + src.width - 1);
  jy = std::min(std::max(jy, src.y0), src.y0 + src.height - 1);
  return src.data + src.stride * (jy - src.y0) + 3 * (jx - src.x0);
}

// The rows and columns taps may read directly: inside both the image and the decoded region.
struct Window {
  int x0, x1, y0, y1;  // [x0, x1) x [y0, y1)
  explicit Window(const SourceRegion& src)
      : x0(std::max(0, src.x0)),
        x1(std::min(src.image_w, src.x0 + src.width)),
        y0(std::max(0, src.y0)),
        y1(std::min(src.image_h, src.y0 + src.height)) {}
};

// One output pixel whose taps may leave the image or the region: border rules, clamping.
void sample_border(const WarpPlan& p, const SourceRegion& src, int nx, int ny, int jx, int jy, const int32_t* wx,
                   const int32_t* wy, uint8_t* out) {
  int64_t acc[3] = {0, 0, 0};
  for (int ty = 0; ty < ny; ++ty) {
    int64_t rs[3] = {0, 0, 0};
    for (int t = 0; t < nx; ++t) {
      // DROP taps outside the image have weight zero; any pixel will do for them.
      const uint8_t* q = pixel_at(p, src, jx + t, jy + ty);
      if (q == nullptr) q = p.fill.data();
      for (int c = 0; c < 3; ++c) rs[c] += static_cast<int64_t>(wx[t]) * q[c];
    }
    for (int c = 0; c < 3; ++c) acc[c] += wy[ty] * rs[c];
  }
  for (int c = 0; c < 3; ++c) {
    const int64_t v = (acc[c] + (int64_t{1} << (2 * kWeightBits - 1))) >> (2 * kWeightBits);
    out[c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
  }
}

// The tabulated kernels: per pixel a phase lookup per axis, integer taps, int64 accumulation
// (warp.py's _generic, bit for bit).
template <int NX, int NY>
void warp_rows(const Mapper& map, const SourceRegion& src, const Axis& ax, const Axis& ay, uint8_t* dst,
               size_t dst_stride, WarpScratch* s) {
  const WarpPlan& p = map.p;
  const Window win(src);
  const int nx = NX > 0 ? NX : ax.count, ny = NY > 0 ? NY : ay.count;
  s->tx.resize(nx), s->ty.resize(ny), s->td.resize(std::max(nx, ny));
  int32_t* tmpx = s->tx.data();
  int32_t* tmpy = s->ty.data();
  double* td = s->td.data();
  constexpr int64_t kHalf = int64_t{1} << (2 * kWeightBits - 1);
  // Grid plans: each column's taps are the same in every row, each row's in every column.
  if (map.grid) {
    s->gx.resize(p.out_w);
    s->gw.resize(static_cast<size_t>(p.out_w) * nx);
    for (int x = 0; x < p.out_w; ++x) {
      if (!map.cok[x]) continue;
      const int32_t* w;
      s->gx[x] = ax.taps(map.grid_u(x), &w, tmpx, td);
      std::copy(w, w + nx, &s->gw[static_cast<size_t>(x) * nx]);
    }
  }
  for (int y = 0; y < p.out_h; ++y) {
    uint8_t* out = dst + dst_stride * y;
    Mapper::Row row;
    map.row(y, &row);
    int grid_jy = 0;
    const int32_t* grid_wy = nullptr;
    if (map.grid && row.ok) grid_jy = ay.taps(map.grid_v(row), &grid_wy, tmpy, td);
    for (int x = 0; x < p.out_w; ++x, out += 3) {
      int jx, jy;
      const int32_t *wx, *wy;
      if (map.grid) {
        if (!row.ok || !map.cok[x]) {
          out[0] = p.fill[0], out[1] = p.fill[1], out[2] = p.fill[2];
          continue;
        }
        jx = s->gx[x], jy = grid_jy, wx = &s->gw[static_cast<size_t>(x) * nx], wy = grid_wy;
      } else {
        double u, v;
        if (!map(x, row, &u, &v)) {
          out[0] = p.fill[0], out[1] = p.fill[1], out[2] = p.fill[2];
          continue;
        }
        jx = ax.taps(u, &wx, tmpx, td);
        jy = ay.taps(v, &wy, tmpy, td);
      }
      if (jx < win.x0 || jx + nx > win.x1 || jy < win.y0 || jy + ny > win.y1) {
        sample_border(p, src, nx, ny, jx, jy, wx, wy, out);
        continue;
      }
      const uint8_t* base = src.data + src.stride * (jy - src.y0) + 3 * (jx - src.x0);
      int64_t a0 = 0, a1 = 0, a2 = 0;
      for (int ty = 0; ty < ny; ++ty, base += src.stride) {
        int32_t r0 = 0, r1 = 0, r2 = 0;
        const uint8_t* q = base;
        for (int t = 0; t < nx; ++t, q += 3) {
          r0 += wx[t] * q[0], r1 += wx[t] * q[1], r2 += wx[t] * q[2];
        }
        a0 += static_cast<int64_t>(wy[ty]) * r0, a1 += static_cast<int64_t>(wy[ty]) * r1;
        a2 += static_cast<int64_t>(wy[ty]) * r2;
      }
      const int64_t v0 = (a0 + kHalf) >> (2 * kWeightBits), v1 = (a1 + kHalf) >> (2 * kWeightBits);
      const int64_t v2 = (a2 + kHalf) >> (2 * kWeightBits);
      out[0] = static_cast<uint8_t>(v0 < 0 ? 0 : (v0 > 255 ? 255 : v0));
      out[1] = static_cast<uint8_t>(v1 < 0 ? 0 : (v1 > 255 ? 255 : v1));
      out[2] = static_cast<uint8_t>(v2 < 0 ? 0 : (v2 > 255 ? 255 : v2));
    }
  }
}

// NEAREST: one pixel per output pixel, copied.
void warp_nearest(const Mapper& map, const SourceRegion& src, const Axis& ax, const Axis& ay, uint8_t* dst,
                  size_t dst_stride) {
  const WarpPlan& p = map.p;
  const double sx = ax.shift + kNearestEpsilon, sy = ay.shift + kNearestEpsilon;
  for (int y = 0; y < p.out_h; ++y) {
    uint8_t* out = dst + dst_stride * y;
    Mapper::Row row;
    map.row(y, &row);
    for (int x = 0; x < p.out_w; ++x, out += 3) {
      double u, v;
      const uint8_t* q = nullptr;
      if (map(x, row, &u, &v)) q = pixel_at(p, src, ifloor(u + sx), ifloor(v + sy));
      const uint8_t* c = q != nullptr ? q : p.fill.data();
      out[0] = c[0], out[1] = c[1], out[2] = c[2];
    }
  }
}

// Plain bilinear in integers (warp.py's _bilinear_fixed): positions to 1/256 pixel, 8-bit
// weights, exact in any implementation (and OpenCV's result for its 1/32-pixel warp positions).
// One bilinear output pixel from its four taps: gy (gx a + fx b) + fy (gx c + fx d) equals the
// four products w00 a + w01 b + w10 c + w11 d, so the sum is exact either way.
inline void blend1(const uint8_t* p00, const uint8_t* p01, const uint8_t* p10, const uint8_t* p11, int fx, int fy,
                   uint8_t* out) {
  const int gx = 256 - fx, gy = 256 - fy;
  const int w00 = gy * gx, w01 = gy * fx, w10 = fy * gx, w11 = fy * fx;
  out[0] = static_cast<uint8_t>((w00 * p00[0] + w01 * p01[0] + w10 * p10[0] + w11 * p11[0] + 32768) >> 16);
  out[1] = static_cast<uint8_t>((w00 * p00[1] + w01 * p01[1] + w10 * p10[1] + w11 * p11[1] + 32768) >> 16);
  out[2] = static_cast<uint8_t>((w00 * p00[2] + w01 * p01[2] + w10 * p10[2] + w11 * p11[2] + 32768) >> 16);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FL_WARP_AVX2 1
// Eight bilinear pixels whose taps are all inside the region (blend1's integer arithmetic, so the
// bytes are the same): four 32-bit gathers (each pixel's top-left, top-right, bottom-left and
// bottom-right RGB plus one byte of the next pixel, which the caller guarantees exists), the
// horizontal step as 16-bit pair products (madd), the vertical one in 32 bits. Measured on
// --aug-level 3's rotations: the blend went from ~20 to ~6 cycles per pixel.
__attribute__((target("avx2"))) void blend8_avx2(const uint8_t* base, size_t stride, const int32_t* off,
                                                 const int32_t* qx, const int32_t* qy, uint8_t* out) {
  const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off));
  const __m256i a = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), o, 1);
  const __m256i b = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base + 3), o, 1);
  const __m256i c = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base + stride), o, 1);
  const __m256i d = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base + stride + 3), o, 1);
  const __m256i byte = _mm256_set1_epi32(255);
  const __m256i fx = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx)), byte);
  const __m256i fy = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy)), byte);
  const __m256i full = _mm256_set1_epi32(256);
  const __m256i gy = _mm256_sub_epi32(full, fy);
  const __m256i wx = _mm256_or_si256(_mm256_sub_epi32(full, fx), _mm256_slli_epi32(fx, 16));  // 16-bit (gx, fx)
  const __m256i half = _mm256_set1_epi32(32768);
  __m256i rgb = _mm256_setzero_si256();
  for (int ch = 0; ch < 3; ++ch) {
    const __m128i sh = _mm_cvtsi32_si128(8 * ch);
    const __m256i pa = _mm256_and_si256(_mm256_srl_epi32(a, sh), byte),
                  pb = _mm256_and_si256(_mm256_srl_epi32(b, sh), byte);
    const __m256i pc = _mm256_and_si256(_mm256_srl_epi32(c, sh), byte),
                  pd = _mm256_and_si256(_mm256_srl_epi32(d, sh), byte);
    const __m256i top = _mm256_madd_epi16(_mm256_or_si256(pa, _mm256_slli_epi32(pb, 16)), wx);
    const __m256i bottom = _mm256_madd_epi16(_mm256_or_si256(pc, _mm256_slli_epi32(pd, 16)), wx);
    const __m256i v = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(_mm256_mullo_epi32(top, gy), _mm256_mullo_epi32(bottom, fy)), half), 16);
    rgb = _mm256_or_si256(rgb, _mm256_sll_epi32(v, sh));
  }
  // [R G B 0] per 32-bit lane -> 3 bytes per pixel, 12 per 128-bit half.
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2, 4, 5, 6, 8, 9,
                                        10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i packed = _mm256_shuffle_epi8(rgb, pack);
  const __m128i lo = _mm256_castsi256_si128(packed), hi = _mm256_extracti128_si256(packed, 1);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), lo);
  const int lo_tail = _mm_extract_epi32(lo, 2), hi_tail = _mm_extract_epi32(hi, 2);
  std::memcpy(out + 8, &lo_tail, 4);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 12), hi);
  std::memcpy(out + 20, &hi_tail, 4);
}

bool warp_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

void warp_bilinear_fixed(const Mapper& map, const SourceRegion& src, uint8_t* dst, size_t dst_stride, WarpScratch* s) {
  const WarpPlan& p = map.p;
  const Window win(src);
  const bool direct = map.separable && p.quantize && src.denom == 1;
  // Grid plans: every column's position is the same in every row (and every row's in every column).
  std::vector<int>& gqx = s->gx;
  if (map.grid) {
    gqx.resize(p.out_w);
    for (int x = 0; x < p.out_w; ++x) gqx[x] = map.cok[x] ? ifloor((map.grid_u(x) - 0.5) * 256.0 + 0.5) : 0;
  }
  const int w = p.out_w;
  s->bq.resize(static_cast<size_t>(w) + 8), s->bqy.resize(static_cast<size_t>(w) + 8),
      s->boff.resize(static_cast<size_t>(w) + 8);
  int32_t* bq = s->bq.data();
  int32_t* bqy = s->bqy.data();
  int32_t* boff = s->boff.data();
#ifdef FL_WARP_AVX2
  // Gathers take 32-bit offsets: regions past 2 GB (never from a JPEG under max_pixels) stay scalar.
  const bool simd = warp_avx2() && src.stride * static_cast<size_t>(src.height) < (size_t{1} << 30);
#endif
  for (int y = 0; y < p.out_h; ++y) {
    uint8_t* row_out = dst + dst_stride * y;
    Mapper::Row row;
    map.row(y, &row);
    const int grid_qy = map.grid && row.ok ? ifloor((map.grid_v(row) - 0.5) * 256.0 + 0.5) : 0;
    // Positions first (1/256 pixel), then the blend: the same values the per-pixel code computed.
    for (int x = 0; x < w; ++x) {
      int qx, qy;
      if (map.grid) {
        if (!row.ok || !map.cok[x]) {
          boff[x] = -2;
          continue;
        }
        qx = gqx[x], qy = grid_qy;
      } else if (direct) {
        // OpenCV's 1/32-pixel positions are whole 1/256 units: (u - 0.5) * 256 = (X >> 5) * 8.
        if (!row.ok || !map.cok[x]) {
          boff[x] = -2;
          continue;
        }
        qx = static_cast<int>(((map.cqx[x] + row.rqx) >> 5) * 8),
        qy = static_cast<int>(((map.cqy[x] + row.rqy) >> 5) * 8);
      } else {
        double u, v;
        if (!map(x, row, &u, &v)) {
          boff[x] = -2;
          continue;
        }
        qx = ifloor((u - 0.5) * 256.0 + 0.5), qy = ifloor((v - 0.5) * 256.0 + 0.5);
      }
      bq[x] = qx, bqy[x] = qy;
      const int x0 = qx >> 8, y0 = qy >> 8;
      // x0 + 2 < x1: the gathers read one byte past the top-right and bottom-right taps.
      boff[x] = x0 >= win.x0 && x0 + 2 < win.x1 && y0 >= win.y0 && y0 + 1 < win.y1
                    ? static_cast<int32_t>(src.stride * (y0 - src.y0) + 3 * static_cast<size_t>(x0 - src.x0))
                    : -1;
    }
    for (int x = 0; x < w;) {
#ifdef FL_WARP_AVX2
      if (simd && x + 8 <= w) {
        bool all = true;
        for (int k = 0; k < 8; ++k) all &= boff[x + k] >= 0;
        if (all) {
          blend8_avx2(src.data, src.stride, boff + x, bq + x, bqy + x, row_out + 3 * static_cast<size_t>(x));
          x += 8;
          continue;
        }
      }
#endif
      uint8_t* out = row_out + 3 * static_cast<size_t>(x);
      if (boff[x] == -2) {
        out[0] = p.fill[0], out[1] = p.fill[1], out[2] = p.fill[2];
      } else {
        const int qx = bq[x], qy = bqy[x];
        const int x0 = qx >> 8, y0 = qy >> 8;
        const uint8_t *p00, *p01, *p10, *p11;
        if (x0 >= win.x0 && x0 + 1 < win.x1 && y0 >= win.y0 && y0 + 1 < win.y1) {
          p00 = src.data + src.stride * (y0 - src.y0) + 3 * (x0 - src.x0);
          p01 = p00 + 3, p10 = p00 + src.stride, p11 = p10 + 3;
        } else {
          p00 = pixel_at(p, src, x0, y0), p01 = pixel_at(p, src, x0 + 1, y0);
          p10 = pixel_at(p, src, x0, y0 + 1), p11 = pixel_at(p, src, x0 + 1, y0 + 1);
          if (p00 == nullptr) p00 = p.fill.data();
          if (p01 == nullptr) p01 = p.fill.data();
          if (p10 == nullptr) p10 = p.fill.data();
          if (p11 == nullptr) p11 = p.fill.data();
        }
        blend1(p00, p01, p10, p11, qx & 255, qy & 255, out);
      }
      ++x;
    }
  }
}

// Picks compile-time tap counts for the common plain cubic (4) and antialiased (3, 4) cases.
void warp_tabulated(const Mapper& map, const SourceRegion& src, const Axis& ax, const Axis& ay, uint8_t* dst,
                    size_t dst_stride, WarpScratch* s) {
  const int a = ax.count, b = ay.count;
  if (a == 4 && b == 4) return warp_rows<4, 4>(map, src, ax, ay, dst, dst_stride, s);
  if (a == 3 && b == 3) return warp_rows<3, 3>(map, src, ax, ay, dst, dst_stride, s);
  if (a == 2 && b == 2) return warp_rows<2, 2>(map, src, ax, ay, dst, dst_stride, s);
  warp_rows<0, 0>(map, src, ax, ay, dst, dst_stride, s);
}

// Bounding box of the source positions (full resolution) of every output pixel inside the frame;
// false when no output pixel is inside it. *frame_extent: the largest |coordinate| of those
// pixels' frame points.
bool source_bbox(const WarpPlan& p, double* u0, double* v0, double* u1, double* v1, double* frame_extent = nullptr) {
  const double cx[4] = {0.0, static_cast<double>(p.out_w), 0.0, static_cast<double>(p.out_w)};
  const double cy[4] = {0.0, 0.0, static_cast<double>(p.out_h), static_cast<double>(p.out_h)};
  double fx0 = 1e300, fy0 = 1e300, fx1 = -1e300, fy1 = -1e300;
  for (int i = 0; i < 4; ++i) {
    const double x = p.to_frame.a * cx[i] + p.to_frame.b * cy[i] + p.to_frame.c;
    const double y = p.to_frame.d * cx[i] + p.to_frame.e * cy[i] + p.to_frame.f;
    fx0 = std::min(fx0, x), fx1 = std::max(fx1, x), fy0 = std::min(fy0, y), fy1 = std::max(fy1, y);
  }
  if (p.has_frame) {
    fx0 = std::max(fx0, p.frame[0]), fy0 = std::max(fy0, p.frame[1]);
    fx1 = std::min(fx1, p.frame[2]), fy1 = std::min(fy1, p.frame[3]);
  }
  if (!(fx1 >= fx0 && fy1 >= fy0)) return false;
  if (p.snap) fx0 -= 0.5, fy0 -= 0.5, fx1 += 0.5, fy1 += 0.5;
  if (frame_extent != nullptr)
    *frame_extent = std::max(std::max(std::fabs(fx0), std::fabs(fx1)), std::max(std::fabs(fy0), std::fabs(fy1)));
  const double gx[4] = {fx0, fx1, fx0, fx1}, gy[4] = {fy0, fy0, fy1, fy1};
  *u0 = *v0 = 1e300, *u1 = *v1 = -1e300;
  for (int i = 0; i < 4; ++i) {
    const double u = p.to_source.a * gx[i] + p.to_source.b * gy[i] + p.to_source.c;
    const double v = p.to_source.d * gx[i] + p.to_source.e * gy[i] + p.to_source.f;
    *u0 = std::min(*u0, u), *u1 = std::max(*u1, u), *v0 = std::min(*v0, v), *v1 = std::max(*v1, v);
  }
  return true;
}

}  // namespace

int warp_denom(const WarpPlan& plan, bool enabled) {
  if (!enabled || !plan.dct_scaling) return 1;
  return dct_scale_denom(std::min(plan.scale_x, plan.scale_y));
}

SourceRect warp_source_rect(const WarpPlan& p, int denom, int scaled_w, int scaled_h) {
  SourceRect r;
  double u0, v0, u1, v1;
  if (!source_bbox(p, &u0, &v0, &u1, &v1) || !(std::fabs(u0) < kMaxPosition && std::fabs(u1) < kMaxPosition &&
                                               std::fabs(v0) < kMaxPosition && std::fabs(v1) < kMaxPosition)) {
    // Every output pixel is fill (or the plan is degenerate): one pixel still validates the image.
    r.x1 = std::min(1, scaled_w), r.y1 = std::min(1, scaled_h);
    return r;
  }
  const Axis ax(p, true, denom, scaled_w, false), ay(p, false, denom, scaled_h, false);
  // Quantised positions move by less than 1/32 pixel (half a pixel for NEAREST); the margin covers
  // the tap range, the NEAREST shift and floor effects.
  const double slack = p.quantize ? 1.0 : 0.0;
  const double mx = ax.support + std::fabs(ax.shift) + ax.scale / 2.0 + 2.0 + slack;
  const double my = ay.support + std::fabs(ay.shift) + ay.scale / 2.0 + 2.0 + slack;
  const double lo_x = std::floor(u0 / denom - mx), hi_x = std::ceil(u1 / denom + mx);
  const double lo_y = std::floor(v0 / denom - my), hi_y = std::ceil(v1 / denom + my);
  r.x0 = static_cast<int>(std::max(0.0, std::min(lo_x, static_cast<double>(scaled_w - 1))));
  r.y0 = static_cast<int>(std::max(0.0, std::min(lo_y, static_cast<double>(scaled_h - 1))));
  r.x1 = static_cast<int>(std::max(static_cast<double>(r.x0 + 1), std::min(hi_x, static_cast<double>(scaled_w))));
  r.y1 = static_cast<int>(std::max(static_cast<double>(r.y0 + 1), std::min(hi_y, static_cast<double>(scaled_h))));
  return r;
}

void warp_region(const WarpPlan& p, const SourceRegion& src, uint8_t* dst, size_t dst_stride, WarpScratch* s) {
  // Plain bilinear on both axes takes the integer path (no tables); NEAREST needs none either.
  const Axis probe_x(p, true, src.denom, src.image_w, false), probe_y(p, false, src.denom, src.image_h, false);
  const bool bilinear = probe_x.fixed2 && probe_y.fixed2;
  const bool tables = !bilinear && p.kernel != WarpKernel::kNearest;
  // Positions stay far inside int range unless the plan is degenerate (no frame, huge maps): only
  // then is every position clamped.
  double u0 = 0, v0 = 0, u1 = 0, v1 = 0, extent = 0;
  const bool any = source_bbox(p, &u0, &v0, &u1, &v1, &extent);
  const double lim = kMaxPosition / 2;
  const bool clamp = !p.has_frame || (any && !(std::fabs(u0) < lim && std::fabs(u1) < lim && std::fabs(v0) < lim &&
                                               std::fabs(v1) < lim && extent < lim));
  const Mapper map(p, src.denom, clamp, s);
  if (p.kernel == WarpKernel::kNearest) {
    warp_nearest(map, src, probe_x, probe_y, dst, dst_stride);
  } else if (bilinear) {
    warp_bilinear_fixed(map, src, dst, dst_stride, s);
  } else {
    const Axis ax(p, true, src.denom, src.image_w, tables), ay(p, false, src.denom, src.image_h, tables);
    warp_tabulated(map, src, ax, ay, dst, dst_stride, s);
  }
}

namespace {

// One output row of warp_gather from x = first on: the scalar definition every path must equal.
void gather_tail(const WarpPlan& p, double rx, double ry, const uint8_t* frame_img, size_t frame_stride, int frame_w,
                 int frame_h, int first, uint8_t* row_out) {
  uint8_t* out = row_out + 3 * static_cast<size_t>(first);
  for (int x = first; x < p.out_w; ++x, out += 3) {
    const double px = x + 0.5;
    const double fx = p.to_frame.a * px + rx, fy = p.to_frame.d * px + ry;
    const uint8_t* c = p.fill.data();
    if (fx >= 0.0 && fx < frame_w && fy >= 0.0 && fy < frame_h &&
        (!p.has_frame || (fx >= p.frame[0] && fx < p.frame[2] && fy >= p.frame[1] && fy < p.frame[3]))) {
      c = frame_img + frame_stride * static_cast<int>(fy) + 3 * static_cast<int>(fx);
    }
    out[0] = c[0], out[1] = c[1], out[2] = c[2];
  }
}

#ifdef FL_WARP_AVX2
// Four pixels at a time: the same double products and sums (no FMA in this target), the frame test
// as one pair of bounds per axis (the conjunction of the scalar's comparisons), truncation by
// cvttpd. Returns the first column it did not write. Measured on RandomAffine's default (nearest):
// warp_gather went from ~15% to ~6% of the decode's profile.
__attribute__((target("avx2"))) int gather_row_avx2(const WarpPlan& p, double rx, double ry, const uint8_t* frame_img,
                                                    size_t frame_stride, int frame_w, int frame_h, uint8_t* row_out) {
  const double lo_x = p.has_frame ? std::max(0.0, p.frame[0]) : 0.0;
  const double hi_x = p.has_frame ? std::min(static_cast<double>(frame_w), p.frame[2]) : frame_w;
  const double lo_y = p.has_frame ? std::max(0.0, p.frame[1]) : 0.0;
  const double hi_y = p.has_frame ? std::min(static_cast<double>(frame_h), p.frame[3]) : frame_h;
  const __m256d va = _mm256_set1_pd(p.to_frame.a), vd = _mm256_set1_pd(p.to_frame.d);
  const __m256d vrx = _mm256_set1_pd(rx), vry = _mm256_set1_pd(ry);
  const __m256d vlx = _mm256_set1_pd(lo_x), vhx = _mm256_set1_pd(hi_x);
  const __m256d vly = _mm256_set1_pd(lo_y), vhy = _mm256_set1_pd(hi_y);
  const __m256d halves = _mm256_setr_pd(0.5, 1.5, 2.5, 3.5);
  alignas(16) int32_t ix[4], iy[4];
  int x = 0;
  for (; x + 4 <= p.out_w; x += 4) {
    const __m256d px = _mm256_add_pd(_mm256_set1_pd(static_cast<double>(x)), halves);  // x + 0.5, exactly
    const __m256d fx = _mm256_add_pd(_mm256_mul_pd(va, px), vrx);
    const __m256d fy = _mm256_add_pd(_mm256_mul_pd(vd, px), vry);
    const __m256d in =
        _mm256_and_pd(_mm256_and_pd(_mm256_cmp_pd(fx, vlx, _CMP_GE_OQ), _mm256_cmp_pd(fx, vhx, _CMP_LT_OQ)),
                      _mm256_and_pd(_mm256_cmp_pd(fy, vly, _CMP_GE_OQ), _mm256_cmp_pd(fy, vhy, _CMP_LT_OQ)));
    const int mask = _mm256_movemask_pd(in);
    _mm_store_si128(reinterpret_cast<__m128i*>(ix), _mm256_cvttpd_epi32(fx));
    _mm_store_si128(reinterpret_cast<__m128i*>(iy), _mm256_cvttpd_epi32(fy));
    uint8_t* out = row_out + 3 * static_cast<size_t>(x);
    for (int k = 0; k < 4; ++k, out += 3) {
      const uint8_t* c =
          (mask >> k) & 1 ? frame_img + frame_stride * iy[k] + 3 * static_cast<size_t>(ix[k]) : p.fill.data();
      out[0] = c[0], out[1] = c[1], out[2] = c[2];
    }
  }
  return x;
}
#endif

}  // namespace

void warp_gather(const WarpPlan& p, const uint8_t* frame_img, size_t frame_stride, int frame_w, int frame_h,
                 uint8_t* dst, size_t dst_stride) {
  for (int y = 0; y < p.out_h; ++y) {
    uint8_t* out = dst + dst_stride * y;
    const double py = y + 0.5;
    const double rx = p.to_frame.b * py + p.to_frame.c, ry = p.to_frame.e * py + p.to_frame.f;
    int first = 0;
#ifdef FL_WARP_AVX2
    if (warp_avx2()) first = gather_row_avx2(p, rx, ry, frame_img, frame_stride, frame_w, frame_h, out);
#endif
    gather_tail(p, rx, ry, frame_img, frame_stride, frame_w, frame_h, first, out);
  }
}

void RegionBuffer::reserve(int y0, int rows, int max_width) {
  stride_ = static_cast<size_t>(std::max(1, max_width)) * 3;
  const size_t need = stride_ * static_cast<size_t>(std::max(1, rows));
  if (data_.size() < need) data_.resize(need);
  y0_ = y0, rows_ = rows, x_origin_ = 0, width_ = 0, received_ = 0;
}

void RegionBuffer::begin(int x_origin, int width) {
  x_origin_ = x_origin;
  width_ = std::min(width, static_cast<int>(stride_ / 3));
}

void RegionBuffer::rows(int y, const uint8_t* const* rgb, int count) {
  for (int i = 0; i < count; ++i) {
    const int r = y + i - y0_;
    if (r < 0 || r >= rows_) continue;
    std::memcpy(data_.data() + stride_ * r, rgb[i], static_cast<size_t>(width_) * 3);
    ++received_;
  }
}

SourceRegion RegionBuffer::region(int image_w, int image_h, int denom) const {
  SourceRegion r;
  r.data = data_.data();
  r.stride = stride_;
  r.x0 = x_origin_, r.y0 = y0_, r.width = width_, r.height = rows_;
  r.image_w = image_w, r.image_h = image_h, r.denom = denom;
  return r;
}

}  // namespace fastload
