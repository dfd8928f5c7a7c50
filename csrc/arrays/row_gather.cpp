#include "arrays/row_gather.h"

#include <cerrno>
#include <unistd.h>

namespace fastload {
namespace {

// Reads len bytes at offset, retrying partial reads and EINTR; false on error or end of file.
bool read_fully(int fd, uint8_t* dst, size_t len, int64_t offset, int* error) {
  while (len > 0) {
    const ssize_t got = ::pread(fd, dst, len, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      *error = got < 0 ? errno : 0;
      return false;
    }
    dst += got;
    len -= static_cast<size_t>(got);
    offset += got;
  }
  return true;
}

}  // namespace

RowGatherFailure gather_rows(const int32_t* fds, const int64_t* offsets, size_t n, size_t row_bytes, uint8_t* out) {
  RowGatherFailure failure;
  size_t start = 0;
  while (start < n) {
    size_t end = start + 1;
    while (end < n && fds[end] == fds[start] && offsets[end] == offsets[end - 1] + static_cast<int64_t>(row_bytes))
      ++end;
    if (!read_fully(fds[start], out + start * row_bytes, (end - start) * row_bytes, offsets[start], &failure.error)) {
      failure.row = static_cast<long long>(start);
      return failure;
    }
    start = end;
  }
  return failure;
}

}  // namespace fastload
