// Pixels stage (native): the inner loops of the pixel ops, one portable scalar set and one AVX-512 set
// (F/BW/DQ/VL + VBMI) that gives the same bytes, chosen at run time.
//
// Every kernel works on packed RGB (HWC uint8, 3 bytes per pixel) and reproduces the reference
// library's arithmetic operation for operation: Pillow for the torchvision ops (float32 blends
// truncated, convert("L")'s 16-bit fixed point, the HSV round trip with its float and double
// steps), OpenCV 3.4 for MXNet's (float32 x * a + b rounded half to even, 14-bit gray, float HLS).
// The SIMD versions never fuse a multiply and an add (no FMA), so their float results are the
// scalar ones; the tests compare both sets on every RGB value where the domain allows it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastload {
namespace pixel {

struct Kernels {
  const char* name;
  // One 256-entry table for every byte.
  void (*lut1)(uint8_t* p, size_t n, const uint8_t* lut);
  // lut[0..255] for R, lut[256..511] for G, lut[512..767] for B.
  void (*lut3)(uint8_t* rgb, size_t pixels, const uint8_t* lut);
  // Sum over the pixels of Pillow's L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16.
  uint64_t (*luma_sum)(const uint8_t* rgb, size_t pixels);
  // Pillow's convert("L") into all three channels.
  void (*grayscale)(uint8_t* rgb, size_t pixels);
  // ImageEnhance.Color: Image.blend(L, rgb, alpha) per channel (float32, truncated, clipped).
  void (*saturation)(uint8_t* rgb, size_t pixels, float alpha);
  // adjust_hue: RGB -> Pillow HSV, hue + shift (mod 256), -> RGB.
  void (*hue)(uint8_t* rgb, size_t pixels, uint8_t shift);
  // Sharpness: rows [1, h - 1) of dst = blend(SMOOTH(src), src, alpha) on the interior columns;
  // src and dst are distinct images of h rows of 3 * w bytes (w >= 3, h >= 3).
  void (*sharpen)(const uint8_t* src, uint8_t* dst, int h, int w, float alpha);
  // Per-channel minimum and maximum (for autocontrast).
  void (*minmax)(const uint8_t* rgb, size_t pixels, uint8_t lo[3], uint8_t hi[3]);
  // MXNet (OpenCV 3.4 on its BGR buffer): sum of cvtColor(CV_RGB2GRAY) of the BGR image.
  uint64_t (*mx_gray_sum)(const uint8_t* rgb, size_t pixels);
  // MXNet saturation: addWeighted(img, alpha, gray, beta, 0).
  void (*mx_saturation)(uint8_t* rgb, size_t pixels, float alpha, float beta);
  // MXNet HSL jitter: BGR2HLS (8 bit), H + dh in [0, 180], L + dl, S + ds in [0, 255], HLS2BGR.
  void (*mx_hls)(uint8_t* rgb, size_t pixels, int dh, int dl, int ds);
  // Pillow's affine_fixed (NEAREST, 16.16 fixed point) from src into dst (both h x w packed RGB; src
  // readable one byte past its end); pixels that map outside get the fill colour.
  void (*affine_nearest_fixed)(const uint8_t* src, uint8_t* dst, int h, int w, const double a[6],
                               const uint8_t fill[3]);
  // Pillow's generic transform with affine_transform + bilinear_filter32RGB, same conventions.
  void (*affine_bilinear)(const uint8_t* src, uint8_t* dst, int h, int w, const double a[6], const uint8_t fill[3]);
};

const Kernels& scalar_kernels();
// nullptr when the CPU (or the build) lacks AVX-512 F/BW/DQ/VL/VBMI.
const Kernels* avx512_kernels();

// The set in use (best available unless forced).
const Kernels& kernels();
// "scalar", "avx512" or "best"; false when unavailable.
bool force_kernels(const char* name);

}  // namespace pixel
}  // namespace fastload
