// Pixels stage (native): the Huffman decoder restart-interval slices run instead of libjpeg's.
#include "decode/entropy_decode.h"

#include <cstring>

// jpegint.h declares jpeg_entropy_decoder, the module interface this decoder implements; libjpeg
// itself calls only its decode_mcu (jdcoefct.c, jdapistd.c) and start_pass (jdinput.c) and reads
// insufficient_data. Without the header the slices keep libjpeg's decoder.
#if __has_include(<jpegint.h>)
extern "C" {
#include <jpegint.h>
}
#define FASTLOAD_HAVE_JPEGINT 1
#endif

namespace fastload {

namespace {

// Zigzag position -> natural (row-major) position, with libjpeg's 16 guard entries: a corrupt run
// can push k past 63, and libjpeg then writes coefficient 63, as does this decoder.
constexpr int kNatural[64 + 16] = {0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
                                   40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
                                   29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
                                   47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

constexpr int kLook = 9;  // bits resolved by one table lookup; longer codes are rare

}  // namespace

// A Huffman table in lookup form. fast[] maps the next kLook bits to (length << 8) | symbol for
// codes of at most kLook bits (0 = a longer code); longer codes are resolved canonically with
// maxcode/valoffset, as in T.81 F.2.2.3.
struct IntervalEntropyDecoder::Table {
  uint16_t fast[1 << kLook];
  int32_t maxcode[17];
  int32_t valoffset[17];
  uint8_t huffval[256];
};

namespace {

// Builds `t` from a DHT table; false for a table libjpeg would refuse too (over-full, all-ones code,
// DC symbol above 15).
bool build_table(const JHUFF_TBL* h, bool dc, IntervalEntropyDecoder::Table* t) {
  if (h == nullptr) return false;
  int count = 0;
  for (int l = 1; l <= 16; ++l) count += h->bits[l];
  if (count > 256) return false;
  std::memset(t->fast, 0, sizeof t->fast);
  int code = 0, k = 0;
  for (int l = 1; l <= 16; ++l) {
    t->valoffset[l] = k - code;
    for (int i = 0; i < h->bits[l]; ++i, ++k, ++code) {
      const uint8_t sym = h->huffval[k];
      if (dc && sym > 15) return false;
      if (l <= kLook) {
        const int shift = kLook - l;
        const uint16_t entry = static_cast<uint16_t>((l << 8) | sym);
        for (int j = code << shift; j < (code + 1) << shift; ++j) t->fast[j] = entry;
      }
    }
    t->maxcode[l] = h->bits[l] != 0 ? code - 1 : -1;
    if (code >= (1 << l)) return false;  // the last code of this length was all ones
    code <<= 1;
  }
  std::memcpy(t->huffval, h->huffval, sizeof t->huffval);
  return true;
}

// A bit reader over unstuffed bytes: `buf` holds the next `count` bits most significant first,
// `p` the next byte to load. One refill tops it up to at least 56 bits without a branch (the
// buffer is padded, so the 8-byte load may run past the data), enough for the longest code plus
// its value bits (16 + 15).
struct BitReader {
  const uint8_t* p;
  uint64_t buf;
  unsigned count;

  inline void refill() {
    uint64_t w;
    std::memcpy(&w, p, sizeof w);
    buf |= __builtin_bswap64(w) >> count;
    p += (63 - count) >> 3;
    count |= 56;
  }
  inline void consume(int n) {
    buf <<= n;
    count -= static_cast<unsigned>(n);
  }
  // Bit position of the next unread bit, relative to `base`.
  inline uint64_t position(const uint8_t* base) const { return static_cast<uint64_t>(p - base) * 8 - count; }
};

// Decodes one symbol at the top of w: its value, and its code length in *len (0: invalid code).
inline int decode_symbol(const IntervalEntropyDecoder::Table& t, uint64_t w, int* len) {
  const unsigned e = t.fast[w >> (64 - kLook)];
  if (e != 0) {
    *len = static_cast<int>(e >> 8);
    return static_cast<int>(e & 0xFF);
  }
  for (int l = kLook + 1; l <= 16; ++l) {
    const int32_t c = static_cast<int32_t>(w >> (64 - l));
    if (c <= t.maxcode[l]) {
      *len = l;
      return t.huffval[t.valoffset[l] + c];
    }
  }
  *len = 0;
  return 0;
}

// The s-bit magnitude category value x (T.81 F.2.2.1 EXTEND), without a branch: the sign of a
// coefficient is a coin toss the branch predictor cannot learn.
// For s in 1..15: x < 2^(s-1) (a negative value) adds 1 - 2^s. Written without left-shifting a
// negative number, which is undefined before C++20.
inline int extend(int x, int s) { return x + (((x - (1 << (s - 1))) >> 31) & (1 - (1 << s))); }

}  // namespace

#ifdef FASTLOAD_HAVE_JPEGINT
// What libjpeg holds as cinfo->entropy while the override runs; `pub` first, so libjpeg's pointer
// is also this object's.
struct EntropyGlue {
  jpeg_entropy_decoder pub;
  IntervalEntropyDecoder* self;

  // libjpeg calls these from its C frames: noexcept, and nothing in them allocates.
  static void start_pass(j_decompress_ptr) noexcept {}  // install() has set the state up
  static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* mcu) noexcept {
    EntropyGlue* g = reinterpret_cast<EntropyGlue*>(cinfo->entropy);
    return g->self->decode_mcu(cinfo, mcu) ? TRUE : FALSE;
  }
};
#else
struct EntropyGlue {};
#endif

bool interval_entropy_available() {
#ifdef FASTLOAD_HAVE_JPEGINT
  return true;
#else
  return false;
#endif
}

IntervalEntropyDecoder::IntervalEntropyDecoder() : tables_(8), glue_(new EntropyGlue()) {
#ifdef FASTLOAD_HAVE_JPEGINT
  glue_->pub.start_pass = &EntropyGlue::start_pass;
  glue_->pub.decode_mcu = &EntropyGlue::decode_mcu;
  glue_->pub.insufficient_data = FALSE;
  glue_->self = this;
#endif
}

IntervalEntropyDecoder::~IntervalEntropyDecoder() = default;

void IntervalEntropyDecoder::reset(const SliceEntropy* data) {
  data_ = data;
  failed_ = false;
}

bool IntervalEntropyDecoder::fail() noexcept {
  failed_ = true;
  return false;
}

bool IntervalEntropyDecoder::install(jpeg_decompress_struct* cinfo) {
#ifndef FASTLOAD_HAVE_JPEGINT
  (void)cinfo;
  return fail();
#else
  if (data_ == nullptr || data_->offsets.size() < 2) return fail();
  if (cinfo->progressive_mode || cinfo->arith_code) return fail();
  if (cinfo->Ss != 0 || cinfo->Se != DCTSIZE2 - 1 || cinfo->Ah != 0 || cinfo->Al != 0) return fail();
  if (cinfo->data_precision != 8) return fail();
  if (cinfo->restart_interval == 0) return fail();
  if (cinfo->comps_in_scan < 1 || cinfo->comps_in_scan > 4 || cinfo->blocks_in_MCU < 1 || cinfo->blocks_in_MCU > 10)
    return fail();
  bool built[8] = {};
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    const int ci = cinfo->MCU_membership[b];
    const jpeg_component_info* comp = cinfo->cur_comp_info[ci];
    const int dct = comp->dc_tbl_no, act = comp->ac_tbl_no;
    if (dct < 0 || dct > 3 || act < 0 || act > 3) return fail();
    if (!built[dct] && !build_table(cinfo->dc_huff_tbl_ptrs[dct], true, &tables_[dct])) return fail();
    if (!built[4 + act] && !build_table(cinfo->ac_huff_tbl_ptrs[act], false, &tables_[4 + act])) return fail();
    built[dct] = built[4 + act] = true;
    dc_[b] = &tables_[dct];
    ac_[b] = &tables_[4 + act];
    comp_[b] = ci;
  }
  blocks_ = cinfo->blocks_in_MCU;
  restart_interval_ = static_cast<int>(cinfo->restart_interval);
  interval_ = 0;
  pos_ = static_cast<uint64_t>(data_->offsets[0]) * 8;
  end_ = static_cast<uint64_t>(data_->offsets[1]) * 8;
  mcus_left_ = restart_interval_;
  std::memset(dc_pred_, 0, sizeof dc_pred_);
  glue_->pub.insufficient_data = FALSE;
  cinfo->entropy = &glue_->pub;
  return true;
#endif
}

bool IntervalEntropyDecoder::next_interval() noexcept {
  // A well-formed interval ends with fewer than 8 padding bits; libjpeg would skip (and warn
  // about) anything more, which the plain path reproduces.
  if (end_ - pos_ >= 8) return fail();
  ++interval_;
  if (interval_ + 1 >= data_->offsets.size()) return fail();
  pos_ = static_cast<uint64_t>(data_->offsets[interval_]) * 8;
  end_ = static_cast<uint64_t>(data_->offsets[interval_ + 1]) * 8;
  std::memset(dc_pred_, 0, sizeof dc_pred_);
  mcus_left_ = restart_interval_;
  return true;
}

bool IntervalEntropyDecoder::decode_mcu(jpeg_decompress_struct*, JBLOCKROW* mcu) noexcept {
  if (failed_) return false;
  if (mcus_left_ == 0 && !next_interval()) return false;
  const uint8_t* base = data_->bytes.data();
  BitReader br{base + (pos_ >> 3), 0, 0};
  br.refill();
  br.consume(static_cast<int>(pos_ & 7));
  for (int b = 0; b < blocks_; ++b) {
    // The caller zeroed the blocks; libjpeg's skip passes mcu == nullptr (decode, keep nothing).
    JCOEF* block = mcu != nullptr ? mcu[b][0] : nullptr;
    const IntervalEntropyDecoder::Table& dct = *dc_[b];
    const IntervalEntropyDecoder::Table& act = *ac_[b];
    br.refill();
    int len;
    int s = decode_symbol(dct, br.buf, &len);
    if (len == 0) return fail();
    br.consume(len);
    int diff = 0;
    if (s != 0) {
      diff = extend(static_cast<int>(br.buf >> (64 - s)), s);
      br.consume(s);
    }
    // Unsigned: malformed files can push the predictor past INT_MAX; libjpeg lets it wrap.
    int& pred = dc_pred_[comp_[b]];
    pred = static_cast<int>(static_cast<unsigned>(pred) + static_cast<unsigned>(diff));
    if (block != nullptr) block[0] = static_cast<JCOEF>(pred);
    for (int k = 1; k < DCTSIZE2; ++k) {
      br.refill();
      s = decode_symbol(act, br.buf, &len);
      if (len == 0) return fail();
      br.consume(len);
      const int run = s >> 4;
      s &= 15;
      if (s != 0) {
        k += run;
        const int v = extend(static_cast<int>(br.buf >> (64 - s)), s);
        br.consume(s);
        if (block != nullptr) block[kNatural[k]] = static_cast<JCOEF>(v);
      } else {
        if (run != 15) break;  // end of block
        k += 15;
      }
    }
  }
  pos_ = br.position(base);
  --mcus_left_;
  if (pos_ > end_) return fail();  // the MCU read into the next interval's bytes
  return true;
}

}  // namespace fastload
