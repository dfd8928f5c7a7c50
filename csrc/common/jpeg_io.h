// Pixels and write stages (native): the one libjpeg error / source / destination module.
//
// Every libjpeg compressor and decompressor fastload creates (batch decode, pack --resize encode,
// restart-marker transcode and its verification) uses these three pieces:
//   JpegErrorManager  libjpeg's default error_exit calls exit(); this one formats the message into a
//                     fixed buffer and longjmps back to the setjmp of the call that entered libjpeg.
//                     Warnings are counted, never printed.
//   use_memory_source the compressed input is a caller's buffer (libjpeg's jpeg_mem_src).
//   GrowingDestination compressed output appended into a malloc'd buffer that doubles as it fills.
//
// Rule for everything here: libjpeg calls these functions from its own C frames, which a C++
// exception must never cross (undefined behaviour: no unwind tables, skipped cleanups). So the
// callbacks are noexcept, allocate nothing through C++ (no std::string, no std::vector growth), and
// report failure the libjpeg way: an allocation failure becomes JERR_OUT_OF_MEMORY, which longjmps
// like any other libjpeg error. Callers copy messages and bytes into C++ containers only after
// libjpeg has returned. A function that calls setjmp keeps only trivially destructible objects
// alive across its libjpeg calls, so the longjmp skips no destructor.
//
// Plain C++ over the libjpeg API: no Python here.
#pragma once

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h uses FILE

extern "C" {
#include <jpeglib.h>
}

namespace fastload {

struct JpegErrorManager {
  jpeg_error_mgr pub;             // first: libjpeg's cinfo->err points here
  std::jmp_buf jump;              // where error_exit returns to (set by the caller before each libjpeg call)
  int warnings;                   // warnings (corrupt-data class) since the last reset
  int error_code;                 // msg_code of the error that jumped (0: none)
  bool saw_eof;                   // libjpeg warned of premature end of data (JWRN_JPEG_EOF)
  char message[JMSG_LENGTH_MAX];  // the error's text, or the premature-EOF warning's
};

// Sets up `em` (jpeg_std_error plus fastload's handlers); attach it with cinfo->err = &em->pub
// before jpeg_create_*.
void init_error_manager(JpegErrorManager* em) noexcept;

// Clears the per-image state (warnings, error code, EOF flag, message).
void reset_error_state(JpegErrorManager* em) noexcept;

// The compressed input is [data, data + size), read in place (it must outlive the decode).
void use_memory_source(jpeg_decompress_struct* cinfo, const uint8_t* data, size_t size) noexcept;

// libjpeg destination appending into a malloc'd buffer, grown by doubling; `pub` first so the
// compressor's dest pointer is also this object's. Trivially destructible (it may live in a
// setjmp frame or a calloc'd state block): release_destination frees the buffer.
struct GrowingDestination {
  jpeg_destination_mgr pub;
  uint8_t* data;    // the buffer (kept between images and reused)
  size_t capacity;  // its size
  size_t size;      // bytes written by the last completed compression
};

// Zeroes `d` and installs its callbacks; attach with cinfo->dest = &d->pub.
void init_destination(GrowingDestination* d) noexcept;
void release_destination(GrowingDestination* d) noexcept;

}  // namespace fastload
