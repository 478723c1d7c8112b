#include "backends/onednn/depthwise_u8.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_DW_AVX512 1
#define QPACK_DW_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

namespace qpack {
namespace onednn_rt {

#ifdef QPACK_DW_AVX512
namespace {

constexpr int kMaxTaps = 64;  // 8x8 windows; larger ones stay on oneDNN

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
  static QPACK_DW_TARGET I load(M m, const void* p) { return _mm512_maskz_loadu_epi8(m, p); }
  static QPACK_DW_TARGET I mask_bytes(M m, I v) { return _mm512_maskz_mov_epi8(m, v); }
  static QPACK_DW_TARGET void store(void* p, M m, I v) { _mm512_mask_storeu_epi8(p, m, v); }
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

struct Ymm {
  using I = __m256i;
  using F = __m256;
  using M = __mmask32;
  static constexpr int64_t kWidth = 32;
  static QPACK_DW_TARGET M mask(int64_t n) {
    return n >= 32 ? ~M(0) : static_cast<M>((uint32_t(1) << n) - 1);
  }
  static QPACK_DW_TARGET I load(M m, const void* p) { return _mm256_maskz_loadu_epi8(m, p); }
  static QPACK_DW_TARGET I mask_bytes(M m, I v) { return _mm256_maskz_mov_epi8(m, v); }
  static QPACK_DW_TARGET void store(void* p, M m, I v) { _mm256_mask_storeu_epi8(p, m, v); }
  static QPACK_DW_TARGET I zero() { return _mm256_setzero_si256(); }
  static QPACK_DW_TARGET I bytes(uint8_t v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static QPACK_DW_TARGET I unpacklo8(I a, I b) { return _mm256_unpacklo_epi8(a, b); }
  static QPACK_DW_TARGET I unpackhi8(I a, I b) { return _mm256_unpackhi_epi8(a, b); }
  static QPACK_DW_TARGET I unpacklo16(I a, I b) { return _mm256_unpacklo_epi16(a, b); }
  static QPACK_DW_TARGET I unpackhi16(I a, I b) { return _mm256_unpackhi_epi16(a, b); }
  static QPACK_DW_TARGET I dot(I acc, I u8, I s8) { return _mm256_dpbusd_epi32(acc, u8, s8); }
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

// Four rows of bytes (taps) -> four vectors of 32-bit lanes holding one
// channel's four taps. Per 128-bit lane j, vector i holds channels
// 16j + 4i .. 16j + 4i + 3. (Named outputs, not arrays: GCC keeps arrays of
// vectors on the stack.)
template <typename V>
QPACK_DW_TARGET inline void interleave(typename V::I t0, typename V::I t1, typename V::I t2,
                                       typename V::I t3, typename V::I& q0, typename V::I& q1,
                                       typename V::I& q2, typename V::I& q3) {
  const auto u0 = V::unpacklo8(t0, t1), u1 = V::unpackhi8(t0, t1);
  const auto u2 = V::unpacklo8(t2, t3), u3 = V::unpackhi8(t2, t3);
  q0 = V::unpacklo16(u0, u2);
  q1 = V::unpackhi16(u0, u2);
  q2 = V::unpacklo16(u1, u3);
  q3 = V::unpackhi16(u1, u3);
}

// The channel of accumulator i's lane l in a block starting at c0.
template <typename V>
inline int64_t lane_channel(int64_t c0, int i, int l) {
  return c0 + 16 * (l / 4) + 4 * i + l % 4;
}

// One block of channels [c0, c0 + V::kWidth), prepared by each run on the
// calling thread from the packed weights (about a microsecond for 960
// channels): weights with four taps per 32-bit lane, the zero-point term,
// and the requantization's multiplier and offset, all in lane order.
template <typename V>
struct Block {
  int64_t c0 = 0;
  typename V::M mask = 0;
  const typename V::I* weights = nullptr;  // [groups][4]
  typename V::I init[4];    // -zero_point * sum of the channel's weights
  typename V::F mult[4];    // src_scale * wei_scale[c] / dst_scale
  typename V::F offset[4];  // bias[c] / dst_scale + dst_zero_point
};

// The weights of tap k for the block's channels (zero past C or past the
// window), from oneDNN's blocks of 16 channels.
template <typename V>
QPACK_DW_TARGET typename V::I tap_weights(const DepthwiseU8& a, int64_t c0, int64_t k) {
  const int64_t taps = a.KH * a.KW, blocks16 = (a.C + 15) / 16;
  if (k >= taps) return V::zero();
  __m128i parts[4];
  for (int64_t i = 0; i < V::kWidth / 16; ++i) {
    const int64_t b16 = c0 / 16 + i;
    parts[i] = b16 < blocks16
                   ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.w + (b16 * taps + k) * 16))
                   : _mm_setzero_si128();
  }
  return V::mask_bytes(V::mask(a.C - c0), V::join(parts));
}

template <typename V>
QPACK_DW_TARGET void prepare(const DepthwiseU8& a, int64_t c0, int64_t groups,
                             typename V::I* weights, Block<V>* blk) {
  blk->c0 = c0;
  blk->mask = V::mask(a.C - c0);
  blk->weights = weights;
  const auto zp = V::bytes(static_cast<uint8_t>(a.q.src_zero_point));
  typename V::I comp[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  for (int64_t g = 0; g < groups; ++g) {
    typename V::I* q = weights + 4 * g;
    interleave<V>(tap_weights<V>(a, c0, 4 * g), tap_weights<V>(a, c0, 4 * g + 1),
                  tap_weights<V>(a, c0, 4 * g + 2), tap_weights<V>(a, c0, 4 * g + 3), q[0], q[1],
                  q[2], q[3]);
    for (int i = 0; i < 4; ++i) comp[i] = V::dot(comp[i], zp, q[i]);
  }
  for (int i = 0; i < 4; ++i) {
    // sum (x - zp) * w = sum x * w - zp * sum w; padded taps read zp, adding 0
    blk->init[i] = V::neg(comp[i]);
    float mult[16], offset[16];
    for (int l = 0; l < V::kWidth / 4; ++l) {
      const int64_t c = lane_channel<V>(c0, i, l);
      const bool real = c < a.C;
      mult[l] = real ? a.q.mult(c) : 0.0f;
      offset[l] = real ? a.q.offset(c) : static_cast<float>(a.q.dst_zero_point);
    }
    blk->mult[i] = V::loadf(mult);
    blk->offset[i] = V::loadf(offset);
  }
}

// Group g of four taps of one block: ptr[4g..4g+3] are their input pixels.
template <typename V>
__attribute__((always_inline)) QPACK_DW_TARGET inline void group_step(
    const Block<V>& b, const uint8_t* const* ptr, int64_t g, typename V::I& acc0,
    typename V::I& acc1, typename V::I& acc2, typename V::I& acc3) {
  const uint8_t* const* p = ptr + 4 * g;
  const typename V::I* w = b.weights + 4 * g;
  typename V::I x0, x1, x2, x3;
  interleave<V>(V::load(b.mask, p[0] + b.c0), V::load(b.mask, p[1] + b.c0),
                V::load(b.mask, p[2] + b.c0), V::load(b.mask, p[3] + b.c0), x0, x1, x2, x3);
  acc0 = V::dot(acc0, x0, w[0]);
  acc1 = V::dot(acc1, x1, w[1]);
  acc2 = V::dot(acc2, x2, w[2]);
  acc3 = V::dot(acc3, x3, w[3]);
}

// One output pixel of one block; ptr[k] is tap k's input pixel (or the
// zero-point row), slots = groups * 4 pointers. kGroups > 0 fixes the group
// count at compile time (3x3 windows: 3), so the loop unrolls and the four
// accumulators stay in their registers (the runtime loop moved each twice
// per multiply-add).
template <typename V, int kGroups>
QPACK_DW_TARGET inline void pixel(const Block<V>& b, const uint8_t* const* ptr, int64_t groups,
                                  typename V::F lo, typename V::F hi, uint8_t* out) {
  const int64_t c0 = b.c0;
  auto acc0 = b.init[0], acc1 = b.init[1], acc2 = b.init[2], acc3 = b.init[3];
  if constexpr (kGroups > 0) {
    #pragma GCC unroll 16
    for (int g = 0; g < kGroups; ++g) group_step<V>(b, ptr, g, acc0, acc1, acc2, acc3);
  } else {
    for (int64_t g = 0; g < groups; ++g) group_step<V>(b, ptr, g, acc0, acc1, acc2, acc3);
  }
  // packs / packus interleave per 128-bit lane: the channels come back in order
  V::store(out + c0, b.mask,
           V::pack(V::requantize(acc0, b.mult[0], b.offset[0], lo, hi),
                   V::requantize(acc1, b.mult[1], b.offset[1], lo, hi),
                   V::requantize(acc2, b.mult[2], b.offset[2], lo, hi),
                   V::requantize(acc3, b.mult[3], b.offset[3], lo, hi)));
}

// A run's prepared blocks in the calling thread's scratch.
struct Prepared {
  int64_t groups = 0;
  int64_t wide = 0, narrow = 0;  // 64- and 32-channel blocks
  Block<Zmm>* zmm = nullptr;
  Block<Ymm>* ymm = nullptr;
  uint8_t* pad = nullptr;        // C + 64 bytes of the source zero point
};

QPACK_DW_TARGET Prepared prepare_all(const DepthwiseU8& a) {
  Prepared p;
  p.groups = (a.KH * a.KW + 3) / 4;
  p.wide = a.C / 64;
  p.narrow = (a.C - 64 * p.wide + 31) / 32;
  const size_t zsize = sizeof(Block<Zmm>) + static_cast<size_t>(p.groups) * 4 * sizeof(__m512i);
  const size_t ysize = sizeof(Block<Ymm>) + static_cast<size_t>(p.groups) * 4 * sizeof(__m256i);
  auto* base = static_cast<uint8_t*>(
      own_u8_scratch(0, p.wide * zsize + p.narrow * ysize + static_cast<size_t>(a.C) + 64));
  p.zmm = reinterpret_cast<Block<Zmm>*>(base);
  auto* zw = reinterpret_cast<__m512i*>(p.zmm + p.wide);
  p.ymm = reinterpret_cast<Block<Ymm>*>(zw + p.wide * p.groups * 4);
  auto* yw = reinterpret_cast<__m256i*>(p.ymm + p.narrow);
  p.pad = reinterpret_cast<uint8_t*>(yw + p.narrow * p.groups * 4);
  std::memset(p.pad, a.q.src_zero_point, static_cast<size_t>(a.C) + 64);
  for (int64_t b = 0; b < p.wide; ++b) {
    prepare<Zmm>(a, 64 * b, p.groups, zw + b * p.groups * 4, new (p.zmm + b) Block<Zmm>);
  }
  for (int64_t b = 0; b < p.narrow; ++b) {
    prepare<Ymm>(a, 64 * p.wide + 32 * b, p.groups, yw + b * p.groups * 4,
                 new (p.ymm + b) Block<Ymm>);
  }
  return p;
}

QPACK_DW_TARGET void run_rows(const DepthwiseU8& a, const Prepared& p, const int64_t* offsets,
                              int64_t row_begin, int64_t row_end) {
  uint8_t qmin = 0, qmax = 255;
  a.q.bounds(&qmin, &qmax);
  const __m512 zlo = Zmm::setf(qmin), zhi = Zmm::setf(qmax);
  const __m256 ylo = Ymm::setf(qmin), yhi = Ymm::setf(qmax);
  const int64_t taps = a.KH * a.KW;
  const int64_t span_h = (a.KH - 1) * a.DH, span_w = (a.KW - 1) * a.DW;
  const uint8_t* ptr[kMaxTaps];
  for (int64_t k = taps; k < p.groups * 4; ++k) ptr[k] = p.pad;  // zero weights there
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t n = r / a.OH, oh = r % a.OH;
    const uint8_t* image = a.x + n * a.H * a.W * a.C;
    uint8_t* out_row = a.y + r * a.OW * a.C;
    const int64_t ih0 = oh * a.SH - a.PT;
    const bool rows_inside = ih0 >= 0 && ih0 + span_h < a.H;
    for (int64_t ow = 0; ow < a.OW; ++ow) {
      const int64_t iw0 = ow * a.SW - a.PL;
      if (rows_inside && iw0 >= 0 && iw0 + span_w < a.W) {
        const uint8_t* origin = image + (ih0 * a.W + iw0) * a.C;
        for (int64_t k = 0; k < taps; ++k) ptr[k] = origin + offsets[k];
      } else {
        for (int64_t kh = 0; kh < a.KH; ++kh) {
          const int64_t ih = ih0 + kh * a.DH;
          for (int64_t kw = 0; kw < a.KW; ++kw) {
            const int64_t iw = iw0 + kw * a.DW;
            const bool inside = ih >= 0 && ih < a.H && iw >= 0 && iw < a.W;
            ptr[kh * a.KW + kw] = inside ? image + (ih * a.W + iw) * a.C : p.pad;
          }
        }
      }
      uint8_t* out = out_row + ow * a.C;
      if (p.groups == 3) {
        for (int64_t b = 0; b < p.wide; ++b) pixel<Zmm, 3>(p.zmm[b], ptr, 3, zlo, zhi, out);
        for (int64_t b = 0; b < p.narrow; ++b) pixel<Ymm, 3>(p.ymm[b], ptr, 3, ylo, yhi, out);
        continue;
      }
      for (int64_t b = 0; b < p.wide; ++b) pixel<Zmm, 0>(p.zmm[b], ptr, p.groups, zlo, zhi, out);
      for (int64_t b = 0; b < p.narrow; ++b) pixel<Ymm, 0>(p.ymm[b], ptr, p.groups, ylo, yhi, out);
    }
  }
}

QPACK_DW_TARGET void run(const DepthwiseU8& a, int threads) {
  const Prepared p = prepare_all(a);
  int64_t offsets[kMaxTaps];
  for (int64_t kh = 0; kh < a.KH; ++kh) {
    for (int64_t kw = 0; kw < a.KW; ++kw) {
      offsets[kh * a.KW + kw] = (kh * a.DH * a.W + kw * a.DW) * a.C;
    }
  }
  const int64_t rows = a.N * a.OH;
  // about 16K outputs per part at least: smaller layers run on the caller
  const int64_t grain = std::max<int64_t>(2, 16384 / std::max<int64_t>(1, a.OW * a.C));
  parallel_chunks(rows, grain, threads, [&](int, int64_t begin, int64_t end) {
    run_rows(a, p, offsets, begin, end);
  });
}

}  // namespace

void depthwise_u8(const DepthwiseU8& a, int threads) { run(a, threads); }

bool depthwise_u8_fits(int64_t KH, int64_t KW, int64_t C) { return KH * KW <= kMaxTaps && C >= 64; }

#else  // not x86-64: oneDNN's own kernel runs

void depthwise_u8(const DepthwiseU8&, int) {}
bool depthwise_u8_fits(int64_t, int64_t, int64_t) { return false; }

#endif

}  // namespace onednn_rt
}  // namespace qpack
