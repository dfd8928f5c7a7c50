// Write stage, input side (native): a tar archive's headers walked in memory, for streamed packs.
//
// fastload/pack/tar_stream.py reads a tar front to back in multi-megabyte chunks. Parsing each
// 512-byte header in Python (the fields, the checksum, a PAX header per member as webdataset writes
// them) costs ~25 us per sample; this walks every whole member of a chunk in one call and returns
// where each one's headers start, where its data lies in the chunk, its size, kind and name.
//
// It is a fast path with the Python reader as the authority: it accepts the common forms only
// (ustar / GNU / v7 headers whose numbers are plain octal, a valid checksum, PAX local headers whose
// records parse and name no sparse data, GNU long names and links) and stops, at the first header of
// the member it does not take, at anything else: a damaged header, a base-256 number, a PAX global
// header, a sparse member, a member whose headers or data (with padding) run past the chunk, the
// end-of-archive block. The Python reader then reads from there, so whatever this returns is what
// the Python reader would have returned, and every error keeps the Python reader's message.
// Plain C++: glue/ingest.cpp holds the Python glue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

// One member, offsets relative to the walked buffer.
struct TarWalkEntry {
  size_t start = 0;  // its first header (PAX / long-name headers included)
  size_t data = 0;   // its data
  size_t size = 0;   // its size (a PAX size= record's, when there is one)
  char kind = '0';   // the header's type flag ('5' for an old-style directory entry named "x/")
  std::string name;  // its name, raw bytes (a PAX path= record's, a GNU long name, or prefix "/" name)
};

// Walks the whole members of buf[pos, len) (pos: at the first header of a member) and appends them
// to `out`, at most `max_members`. Returns where it stopped: the first header of the first member
// not taken (len when the buffer ends exactly after the last one).
size_t walk_tar(const uint8_t* buf, size_t len, size_t pos, size_t max_members, std::vector<TarWalkEntry>* out);

}  // namespace fastload
