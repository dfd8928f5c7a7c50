// Write stage, input side (native): see tar_walk.h.
#include "pack/tar_walk.h"

#include <cstring>

namespace fastload {

namespace {

constexpr size_t kBlock = 512;

inline size_t padded(size_t n) { return (n + kBlock - 1) & ~(kBlock - 1); }

// A numeric header field as the Python reader's first attempt reads it: spaces and NULs stripped
// from both ends, then octal digits only (an empty field is 0). False for anything else (base-256,
// stray characters): the Python reader decides those.
bool octal_field(const uint8_t* p, size_t n, uint64_t* value) {
  size_t a = 0, b = n;
  while (a < b && (p[a] == ' ' || p[a] == 0)) ++a;
  while (b > a && (p[b - 1] == ' ' || p[b - 1] == 0)) --b;
  if (b - a > 21) return false;  // more than 63 bits
  uint64_t v = 0;
  for (size_t i = a; i < b; ++i) {
    if (p[i] < '0' || p[i] > '7') return false;
    v = (v << 3) | static_cast<uint64_t>(p[i] - '0');
  }
  *value = v;
  return true;
}

// Whether `stored` is the header's checksum: its bytes summed with the checksum field as spaces,
// unsigned (POSIX) or signed (old archives).
bool checksum_ok(const uint8_t* h, uint64_t stored) {
  int64_t unsigned_sum = 8 * ' ', signed_sum = 8 * ' ';
  for (size_t i = 0; i < kBlock; ++i) {
    if (i >= 148 && i < 156) continue;
    unsigned_sum += h[i];
    signed_sum += static_cast<int8_t>(h[i]);
  }
  return static_cast<int64_t>(stored) == unsigned_sum || static_cast<int64_t>(stored) == signed_sum;
}

inline bool contains(const uint8_t* p, size_t n, const char* what) {
  const size_t k = std::strlen(what);
  if (n < k) return false;
  for (size_t i = 0; i + k <= n; ++i) {
    if (p[i] == static_cast<uint8_t>(what[0]) && std::memcmp(p + i, what, k) == 0) return true;
  }
  return false;
}

inline size_t until_nul(const uint8_t* p, size_t n) {
  const void* z = std::memchr(p, 0, n);
  return z == nullptr ? n : static_cast<size_t>(static_cast<const uint8_t*>(z) - p);
}

// The records of a PAX extended header ("%d %s=%s\n", the length counting itself) that matter
// here: path and size. False where the Python reader would raise or where it must decide (a length
// that is not plain digits, a record running past the header, GNU.sparse keys, a size that is not
// plain digits).
bool pax_records(const uint8_t* d, size_t n, bool* has_path, std::string* path, bool* has_size, uint64_t* size) {
  size_t pos = 0;
  while (pos < n && d[pos] != 0) {
    size_t space = pos;
    while (space < n && d[space] != ' ') ++space;
    if (space == n || space == pos || space - pos > 18) return false;
    uint64_t length = 0;
    for (size_t i = pos; i < space; ++i) {
      if (d[i] < '0' || d[i] > '9') return false;
      length = length * 10 + static_cast<uint64_t>(d[i] - '0');
    }
    if (length == 0 || length > n - pos || pos + length < space + 2) return false;
    const uint8_t* rec = d + space + 1;
    const size_t rec_len = pos + length - (space + 1);  // the record, newline included
    if (rec[rec_len - 1] != '\n') return false;
    const void* eq = std::memchr(rec, '=', rec_len - 1);
    if (eq == nullptr) return false;
    const size_t key_len = static_cast<size_t>(static_cast<const uint8_t*>(eq) - rec);
    const uint8_t* value = rec + key_len + 1;
    const size_t value_len = rec_len - 1 - key_len - 1;
    if (key_len >= 11 && std::memcmp(rec, "GNU.sparse.", 11) == 0) return false;
    if (key_len == 4 && std::memcmp(rec, "path", 4) == 0) {
      *has_path = true;
      path->assign(reinterpret_cast<const char*>(value), value_len);
    } else if (key_len == 4 && std::memcmp(rec, "size", 4) == 0) {
      if (value_len == 0 || value_len > 18) return false;
      uint64_t v = 0;
      for (size_t i = 0; i < value_len; ++i) {
        if (value[i] < '0' || value[i] > '9') return false;
        v = v * 10 + static_cast<uint64_t>(value[i] - '0');
      }
      *has_size = true;
      *size = v;
    }
    pos += length;
  }
  return true;
}

}  // namespace

size_t walk_tar(const uint8_t* buf, size_t len, size_t pos, size_t max_members, std::vector<TarWalkEntry>* out) {
  size_t taken = 0;
  while (taken < max_members) {
    const size_t start = pos;  // the member's first header: where the Python reader takes over
    size_t at = pos;
    bool has_path = false, has_size = false, has_long = false;
    std::string pax_path, long_name;
    uint64_t pax_size = 0;
    for (;;) {  // the member's extended headers, then its own
      if (at > len || len - at < kBlock) return start;
      const uint8_t* h = buf + at;
      uint64_t stored = 0, size = 0;
      if (!octal_field(h + 148, 8, &stored)) return start;  // (an all-zero block parses as 0: refused below)
      if (!checksum_ok(h, stored)) return start;            // damaged, or the end-of-archive block
      if (!octal_field(h + 124, 12, &size)) return start;
      const char kind = static_cast<char>(h[156]);
      const size_t body = at + kBlock;
      if (size > len || padded(size) > len - body) return start;  // its data runs past the buffer
      if (kind == 'x' || kind == 'L' || kind == 'K') {
        const uint8_t* blob = buf + body;
        if (kind == 'x') {
          // As the Python reader: a PAX header without these keys (webdataset's carry an mtime) is
          // not parsed at all.
          if (contains(blob, size, "path=") || contains(blob, size, "size=") || contains(blob, size, "GNU.sparse")) {
            if (!pax_records(blob, size, &has_path, &pax_path, &has_size, &pax_size)) return start;
          }
        } else if (kind == 'L') {
          has_long = true;
          long_name.assign(reinterpret_cast<const char*>(blob), until_nul(blob, size));
        }
        at = body + padded(size);
        continue;
      }
      if (kind == 'g' || kind == 'S') return start;  // global headers, sparse members: the Python reader's
      TarWalkEntry e;
      e.start = start;
      e.kind = kind;
      if (has_path) {
        e.name = std::move(pax_path);
      } else if (has_long) {
        e.name = std::move(long_name);
      } else {
        e.name.assign(reinterpret_cast<const char*>(h), until_nul(h, 100));
        if (std::memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != 0) {
          e.name = std::string(reinterpret_cast<const char*>(h + 345), until_nul(h + 345, 155)) + "/" + e.name;
        }
      }
      if (has_size) {
        size = pax_size;
        if (size > len || padded(size) > len - body) return start;
      }
      if (e.kind == 0 && !e.name.empty() && e.name.back() == '/') e.kind = '5';  // an old-style directory
      if (e.kind == '5') {
        while (!e.name.empty() && e.name.back() == '/') e.name.pop_back();
      }
      e.data = body;
      e.size = static_cast<size_t>(size);
      out->push_back(std::move(e));
      ++taken;
      pos = body + padded(size);
      break;
    }
  }
  return pos;
}

}  // namespace fastload
