// Restart-indexed JPEGs, shared by both halves (pack/restart_transcode: pack time,
// decode/restart_slice: decode time): the MCU grid and restart interval a JPEG's headers describe.
//
// Restart markers (RSTn) reset the entropy decoder (bit buffer and DC predictors), so the compressed
// bytes between two markers decode on their own. With an interval of N MCUs where N divides the MCU
// row width, every MCU row is exactly `intervals_per_row` intervals, and a crop needs only the
// intervals of the interval columns and MCU rows it touches (restart_slice.h). The pack-time
// transcode (restart_transcode.h) writes such files.
//
// Plain C++: no Python, no libjpeg here.
#pragma once

#include "fastload_abi.h"  // RestartGeometry

namespace fastload {

// RestartGeometry (fastload/engine_abi.py): what a JPEG's headers say about its restart intervals
// and MCU grid.

// MCU grid of the single interleaved scan libjpeg writes (or of the lone component's scan).
inline void fill_geometry(int width, int height, int components, const int* h_samp, const int* v_samp,
                          int restart_interval, RestartGeometry* geo) {
  int max_h = 1, max_v = 1;
  for (int c = 0; c < components; ++c) {
    if (h_samp[c] > max_h) max_h = h_samp[c];
    if (v_samp[c] > max_v) max_v = v_samp[c];
  }
  geo->width = width;
  geo->height = height;
  geo->components = components;
  geo->subsampled_x = geo->subsampled_y = false;
  if (components == 1) {
    // A non-interleaved scan's MCU is one block of that component, whatever its sampling factors.
    geo->mcu_width = geo->mcu_height = 8;
  } else {
    geo->mcu_width = 8 * max_h;
    geo->mcu_height = 8 * max_v;
    for (int c = 0; c < components; ++c) {
      if (h_samp[c] < max_h) geo->subsampled_x = true;
      if (v_samp[c] < max_v) geo->subsampled_y = true;
    }
  }
  geo->mcus_per_row = (width + geo->mcu_width - 1) / geo->mcu_width;
  geo->mcu_rows = (height + geo->mcu_height - 1) / geo->mcu_height;
  geo->restart_interval = restart_interval;
  geo->intervals_per_row =
      (restart_interval > 0 && geo->mcus_per_row % restart_interval == 0) ? geo->mcus_per_row / restart_interval : 0;
}

}  // namespace fastload
