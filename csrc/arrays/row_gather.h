// Read stage: gather fixed-size rows of files into one buffer with pread (array shards).
//
// Array shards are read with pread rather than through a memory map so that a file truncated under
// a running job gives a short read, reported as an error, instead of SIGBUS. A batch of random rows
// is many small reads; doing them here, in one GIL-free call, costs a syscall per run of rows instead
// of a Python call per row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fastload_abi.h"  // RowGatherFailure

namespace fastload {

// out[i * row_bytes, (i + 1) * row_bytes) = bytes of file fds[i] at offsets[i]. Consecutive rows of
// the same file at consecutive offsets are read by one pread. Stops at the first short read.
RowGatherFailure gather_rows(const int32_t* fds, const int64_t* offsets, size_t n, size_t row_bytes, uint8_t* out);

}  // namespace fastload
