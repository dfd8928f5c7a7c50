// Pixels stage (native): the single-image primitives of the pixel ops (torchvision's PIL backend and
// MXNet's OpenCV arithmetic) on packed RGB (HWC uint8, h rows of 3 * w bytes), in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastload {
namespace pixel {

// torchvision F.adjust_* on a PIL image (Pillow's ImageEnhance / ImageOps arithmetic).
void brightness(uint8_t* rgb, size_t pixels, double factor);
void contrast(uint8_t* rgb, size_t pixels, double factor);
void saturation(uint8_t* rgb, size_t pixels, double factor);
void sharpness(uint8_t* rgb, int h, int w, double factor, std::vector<uint8_t>* scratch);
void hue(uint8_t* rgb, size_t pixels, double factor);
void grayscale(uint8_t* rgb, size_t pixels);
void posterize(uint8_t* rgb, size_t pixels, int bits);
void solarize(uint8_t* rgb, size_t pixels, double threshold);
void autocontrast(uint8_t* rgb, size_t pixels);
void equalize(uint8_t* rgb, size_t pixels);
void invert(uint8_t* rgb, size_t pixels);
// PCA lighting: each channel + shift[c] grey levels, rounded half to even, clipped.
void add_rounded(uint8_t* rgb, size_t pixels, const double shift[3]);

// MXNet's default augmenter (OpenCV 3.4 on its BGR buffer): see fastload/transforms/mxnet_color.py.
void mx_brightness(uint8_t* rgb, size_t pixels, float alpha);
void mx_contrast(uint8_t* rgb, size_t pixels, float alpha);
void mx_saturation(uint8_t* rgb, size_t pixels, float alpha);
void mx_hls(uint8_t* rgb, size_t pixels, int dh, int dl, int ds);
void mx_pca(uint8_t* rgb, size_t pixels, const float pca[3]);

// Pillow's Image.transform(AFFINE, matrix, NEAREST | BILINEAR | BICUBIC, fillcolor) or its exact
// transposes; plan = (mode, a0..a5) as fastload.transforms.primitives.WarpPlan.as_row().
enum class WarpFilter { kNearest, kBilinear, kBicubic };
void warp_filtered(uint8_t* rgb, int h, int w, const double plan[7], WarpFilter filter, const uint8_t fill[3],
                   std::vector<uint8_t>* scratch);
inline void warp(uint8_t* rgb, int h, int w, const double plan[7], bool bilinear, const uint8_t fill[3],
                 std::vector<uint8_t>* scratch) {
  warp_filtered(rgb, h, w, plan, bilinear ? WarpFilter::kBilinear : WarpFilter::kNearest, fill, scratch);
}

}  // namespace pixel
}  // namespace fastload
