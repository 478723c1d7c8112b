#include "backends/onednn/depthwise_u8.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_DW_X86 1
#endif

namespace qpack {
namespace onednn_rt {

#ifdef QPACK_DW_X86
namespace {

constexpr int kMaxTaps = 64;  // 8x8 windows; larger ones stay on oneDNN

// ---- AVX2: u8 x s8 pairs into int16 (vpmaddubsw), then int32 (vpmaddwd by 1):
// exact when every weight is within [-64, 64] (a pair sum is at most
// 2 * 255 * 64 = 32640); the caller runs it only on such weights.

namespace avx2 {
#define QPACK_DW_TARGET __attribute__((target("avx2,fma")))

// What the AVX2 and the AVX-512 32-channel blocks share (AVX2 and FMA only;
// the AVX-512 functions inline them).
struct Ymm256 {
  using I = __m256i;
  using F = __m256;
  static constexpr int64_t kWidth = 32;
  static QPACK_DW_TARGET I zero() { return _mm256_setzero_si256(); }
  static QPACK_DW_TARGET I bytes(uint8_t v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static QPACK_DW_TARGET I unpacklo8(I a, I b) { return _mm256_unpacklo_epi8(a, b); }
  static QPACK_DW_TARGET I unpackhi8(I a, I b) { return _mm256_unpackhi_epi8(a, b); }
  static QPACK_DW_TARGET I unpacklo16(I a, I b) { return _mm256_unpacklo_epi16(a, b); }
  static QPACK_DW_TARGET I unpackhi16(I a, I b) { return _mm256_unpackhi_epi16(a, b); }
  static QPACK_DW_TARGET I neg(I v) { return _mm256_sub_epi32(zero(), v); }
  static QPACK_DW_TARGET F loadf(const float* p) { return _mm256_loadu_ps(p); }
  static QPACK_DW_TARGET F setf(float v) { return _mm256_set1_ps(v); }
  static QPACK_DW_TARGET I requantize(I acc, F mult, F offset, F lo, F hi) {
    const F v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), mult, offset);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));  // half to even
  }
  static QPACK_DW_TARGET I pack(I y0, I y1, I y2, I y3) {
    return _mm256_packus_epi16(_mm256_packs_epi32(y0, y1), _mm256_packs_epi32(y2, y3));
  }
  static QPACK_DW_TARGET I join(const __m128i* parts) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(parts[0]), parts[1], 1);
  }
};

// 32 channels; masks are byte counts. Parts of 8, 16 or 24 bytes (the tails
// of channel counts that are multiples of 8: 40, 144, 120) load and store
// directly, other parts through a stack buffer.
struct Avx2 : Ymm256 {
  using M = int64_t;
  static QPACK_DW_TARGET M mask(int64_t n) { return n >= 32 ? 32 : n; }
  static QPACK_DW_TARGET I load(M m, const void* p) {
    const auto* q = static_cast<const __m128i*>(p);
    switch (m) {
      case 32: return _mm256_loadu_si256(static_cast<const __m256i*>(p));
      case 24: return _mm256_inserti128_si256(_mm256_zextsi128_si256(_mm_loadu_si128(q)),
                                              _mm_loadl_epi64(q + 1), 1);
      case 16: return _mm256_zextsi128_si256(_mm_loadu_si128(q));
      case 8: return _mm256_zextsi128_si256(_mm_loadl_epi64(q));
      default: break;
    }
    alignas(32) uint8_t b[32] = {};
    std::memcpy(b, p, static_cast<size_t>(m));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
  }
  static QPACK_DW_TARGET I mask_bytes(M m, I v) {
    const I index = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                                     20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
    return _mm256_and_si256(v, _mm256_cmpgt_epi8(_mm256_set1_epi8(static_cast<char>(m)), index));
  }
  static QPACK_DW_TARGET void store(void* p, M m, I v) {
    auto* q = static_cast<__m128i*>(p);
    switch (m) {
      case 32: return _mm256_storeu_si256(static_cast<__m256i*>(p), v);
      case 24:
        _mm_storeu_si128(q, _mm256_castsi256_si128(v));
        return _mm_storel_epi64(q + 1, _mm256_extracti128_si256(v, 1));
      case 16: return _mm_storeu_si128(q, _mm256_castsi256_si128(v));
      case 8: return _mm_storel_epi64(q, _mm256_castsi256_si128(v));
      default: break;
    }
    alignas(32) uint8_t b[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), v);
    std::memcpy(p, b, static_cast<size_t>(m));
  }
  static QPACK_DW_TARGET I dot(I acc, I u8, I s8) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
  }
};

#include "backends/onednn/depthwise_u8_kernel.inc"
#undef QPACK_DW_TARGET
}  // namespace avx2

// ---- AVX-512 VNNI: u8 x s8 quads into int32 (vpdpbusd), exact for any weights

namespace avx512 {
#define QPACK_DW_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))

// The two vector widths, as the algorithm below needs them. Channels go in
// blocks of 64 (zmm), and the last < 64 channels in blocks of 32 (ymm): on
// cores that split zmm work into two 256-bit halves, a half-empty zmm block
// costs as much as a full one.
struct Zmm {
  using I = __m512i;
  using F = __m512;
  using M = __mmask64;
  static constexpr int64_t kWidth = 64;
  static QPACK_DW_TARGET M mask(int64_t n) {
    return n >= 64 ? ~M(0) : static_cast<M>((uint64_t(1) << n) - 1);
  }
  // Whole blocks load and store without a mask: masked byte moves under a
  // full mask ran the 3x3 x64 @56^2 layer at 37 us against 21 (x144: 92
  // against 63), one Zen 5 thread.
  static QPACK_DW_TARGET I load(M m, const void* p) {
    return m == ~M(0) ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(m, p);
  }
  static QPACK_DW_TARGET I mask_bytes(M m, I v) { return _mm512_maskz_mov_epi8(m, v); }
  static QPACK_DW_TARGET void store(void* p, M m, I v) {
    if (m == ~M(0)) {
      _mm512_storeu_si512(p, v);
    } else {
      _mm512_mask_storeu_epi8(p, m, v);
    }
  }
  static QPACK_DW_TARGET I zero() { return _mm512_setzero_si512(); }
  static QPACK_DW_TARGET I bytes(uint8_t v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static QPACK_DW_TARGET I unpacklo8(I a, I b) { return _mm512_unpacklo_epi8(a, b); }
  static QPACK_DW_TARGET I unpackhi8(I a, I b) { return _mm512_unpackhi_epi8(a, b); }
  static QPACK_DW_TARGET I unpacklo16(I a, I b) { return _mm512_unpacklo_epi16(a, b); }
  static QPACK_DW_TARGET I unpackhi16(I a, I b) { return _mm512_unpackhi_epi16(a, b); }
  static QPACK_DW_TARGET I dot(I acc, I u8, I s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
  static QPACK_DW_TARGET I neg(I v) { return _mm512_sub_epi32(zero(), v); }
  static QPACK_DW_TARGET F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static QPACK_DW_TARGET F setf(float v) { return _mm512_set1_ps(v); }
  static QPACK_DW_TARGET I requantize(I acc, F mult, F offset, F lo, F hi) {
    const F v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), mult, offset);
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));  // half to even
  }
  static QPACK_DW_TARGET I pack(I y0, I y1, I y2, I y3) {
    return _mm512_packus_epi16(_mm512_packs_epi32(y0, y1), _mm512_packs_epi32(y2, y3));
  }
  // Four 16-channel parts (zero when absent) as one vector.
  static QPACK_DW_TARGET I join(const __m128i* parts) {
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(parts[0]), parts[1], 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(parts[2]), parts[3], 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
};

struct Ymm : avx2::Ymm256 {
  using M = __mmask32;
  static QPACK_DW_TARGET M mask(int64_t n) {
    return n >= 32 ? ~M(0) : static_cast<M>((uint32_t(1) << n) - 1);
  }
  static QPACK_DW_TARGET I load(M m, const void* p) {
    return m == ~M(0) ? _mm256_loadu_si256(static_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi8(m, p);
  }
  static QPACK_DW_TARGET I mask_bytes(M m, I v) { return _mm256_maskz_mov_epi8(m, v); }
  static QPACK_DW_TARGET void store(void* p, M m, I v) {
    if (m == ~M(0)) {
      _mm256_storeu_si256(static_cast<__m256i*>(p), v);
    } else {
      _mm256_mask_storeu_epi8(p, m, v);
    }
  }
  static QPACK_DW_TARGET I dot(I acc, I u8, I s8) { return _mm256_dpbusd_epi32(acc, u8, s8); }
};

#include "backends/onednn/depthwise_u8_kernel.inc"
#undef QPACK_DW_TARGET
}  // namespace avx512

}  // namespace

void depthwise_u8(const DepthwiseU8& a, int threads, DepthwiseIsa isa) {
  if (isa == DepthwiseIsa::avx512_vnni) {
    avx512::run<avx512::Zmm, avx512::Ymm>(a, threads);
  } else {
    avx2::run<avx2::Avx2, avx2::Avx2>(a, threads);
  }
}

bool depthwise_u8_fits(int64_t KH, int64_t KW, int64_t C, DepthwiseIsa isa) {
  if (KH * KW > kMaxTaps) return false;
  if (isa == DepthwiseIsa::avx512_vnni) return C >= 64 && own_u8_available();
  // Channels in multiples of 8 (other tails go through a stack buffer). Past
  // 3x3 a last block of 8 channels (40, 72) costs a whole 32-channel one per
  // tap: oneDNN is faster there (5x5 x72 stride 2 @56²: 172 against 125 us).
  return C >= 16 && C % 8 == 0 && (KH * KW <= 9 || C % 32 != 8) && own_avx2_available();
}

#else  // not x86-64: oneDNN's own kernel runs

void depthwise_u8(const DepthwiseU8&, int, DepthwiseIsa) {}
bool depthwise_u8_fits(int64_t, int64_t, int64_t, DepthwiseIsa) { return false; }

#endif

}  // namespace onednn_rt
}  // namespace qpack
