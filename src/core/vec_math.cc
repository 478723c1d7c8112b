#include "core/vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_VEC_X86 1
#endif

namespace qpack {

#ifdef QPACK_VEC_X86
namespace {

// QPACK_VEC_MATH=0: none of this file's vector code, the callers' scalar loops
// everywhere (to compare them; read once).
bool vec_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("QPACK_VEC_MATH");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

int isa_level() {
  static const int isa = !vec_enabled()                                                      ? 0
                         : __builtin_cpu_supports("avx512f")                                 ? 2
                         : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1
                                                                                             : 0;
  return isa;
}

// AVX-512 BW and VL beside F: masked byte loads (every AVX-512 CPU but Xeon Phi)
bool has_avx512bw() {
  static const bool ok = isa_level() == 2 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return ok;
}

// VBMI: byte permutes across a 64-byte vector (Ice Lake, Zen 4 and later)
bool has_vbmi() {
  static const bool ok = has_avx512bw() && __builtin_cpu_supports("avx512vbmi");
  return ok;
}

// Cephes expf: n = round(x log2 e), r = x - n ln 2 (in two parts), exp(r)
// by a degree-5 polynomial, times 2^n.
constexpr float kExpHi = 88.3762626647949f, kExpLo = -88.3762626647949f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

// erf for GELU, fitted here (Lawson-weighted least squares, float64) and checked in float:
// |z| <= kErfSplit: erf(z) = z + z P(z^2), relative error 1.5e-8 before rounding;
// beyond: erfc(|z|) = exp(-z^2 + R(min(|z|, 4))), R(z) = log(erfc(z)) + z^2 within 1.2e-8.
constexpr float kErfSplit = 0.921875f;
constexpr float kErfA[6] = {1.283791516e-01f, -3.761250567e-01f, 1.128192716e-01f,
                            -2.677023140e-02f, 4.998000638e-03f, -6.013393293e-04f};
constexpr float kErfB[9] = {2.942801203e-04f, -1.130131514e+00f, 3.680046993e-01f,
                            -1.099252068e-01f, 2.633555198e-02f, -4.730285949e-03f,
                            5.907160468e-04f, -4.535467375e-05f, 1.602494482e-06f};
constexpr float kSqrtHalf = 0.70710678118654752f;

#define QPACK_AVX512 __attribute__((target("avx512f")))
#define QPACK_AVX2 __attribute__((target("avx2,fma")))
#define QPACK_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))
#define QPACK_AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))

// exp: x clamped to [kExp512Lo, kExp512Hi] (NaN passes: min/max give their
// second operand for a NaN), then vscalefps makes 2^n p overflow to +inf and
// underflow to denormals and 0 as std::exp does (sigmoid(-inf) = 0, SiLU(-inf)
// = -inf / inf = NaN as PyTorch's). No compares or blends: 14 vector ops.
constexpr float kExp512Hi = 89.0f, kExp512Lo = -104.0f;
// exp(r) = 1 + r + r^2 Q(r) on |r| <= ln 2 / 2, Q of degree 4 fitted here for
// relative error (Lawson-weighted least squares, float64): 1.2e-7 (2 ulp)
// evaluated in float, one multiply-add less than Cephes' degree 5.
constexpr float kQ0 = 0.4999999403953552f, kQ1 = 0.1666652113199234f, kQ2 = 0.04166838899254799f,
                kQ3 = 0.008368710055947304f, kQ4 = 0.001381461275741458f;
QPACK_AVX512 inline __m512 exp512(__m512 v) {
  const __m512 x = _mm512_min_ps(_mm512_set1_ps(kExp512Hi), _mm512_max_ps(_mm512_set1_ps(kExp512Lo), v));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kQ4);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kQ3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kQ2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kQ1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kQ0));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// GELU(x) = x / 2 (1 + erf(x / sqrt 2)): 1 + erf(z) as 1 + z + z P(z^2) near 0, else
// 2 - erfc(z) (z > 0) or erfc(-z) itself (z < 0: no cancellation, tiny values keep
// their relative accuracy).
QPACK_AVX512 inline __m512 gelu512(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(kSqrtHalf));
  const __m512 a = _mm512_abs_ps(z);
  const __m512 s = _mm512_mul_ps(z, z);
  __m512 p = _mm512_set1_ps(kErfA[5]);
  for (int k = 4; k >= 0; --k) p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(kErfA[k]));
  const __m512 near = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(z, p, z));
  const __m512 t = _mm512_min_ps(a, _mm512_set1_ps(4.0f));
  __m512 r = _mm512_set1_ps(kErfB[8]);
  for (int k = 7; k >= 0; --k) r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(kErfB[k]));
  const __m512 e = exp512(_mm512_fnmadd_ps(a, a, r));
  __m512 f = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GT_OQ), e,
                                  _mm512_sub_ps(_mm512_set1_ps(2.0f), e));
  f = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(kErfSplit), _CMP_LE_OQ), f, near);
  return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), f);
}

QPACK_AVX2 inline __m256 exp256(__m256 v) {
  const __m256 x = _mm256_min_ps(_mm256_set1_ps(kExpHi), _mm256_max_ps(_mm256_set1_ps(kExpLo), v));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n through the exponent bits (n in [-127, 128] after the clamp)
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  p = _mm256_blendv_ps(p, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(v, _mm256_set1_ps(kExpHi), _CMP_GT_OQ));
  return _mm256_blendv_ps(p, _mm256_setzero_ps(), _mm256_cmp_ps(v, _mm256_set1_ps(kExpLo), _CMP_LT_OQ));
}

QPACK_AVX2 inline __m256 gelu256(__m256 x) {
  const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(kSqrtHalf));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);
  const __m256 s = _mm256_mul_ps(z, z);
  __m256 p = _mm256_set1_ps(kErfA[5]);
  for (int k = 4; k >= 0; --k) p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(kErfA[k]));
  const __m256 near = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(z, p, z));
  const __m256 t = _mm256_min_ps(a, _mm256_set1_ps(4.0f));
  __m256 r = _mm256_set1_ps(kErfB[8]);
  for (int k = 7; k >= 0; --k) r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(kErfB[k]));
  const __m256 e = exp256(_mm256_fnmadd_ps(a, a, r));
  __m256 f = _mm256_blendv_ps(e, _mm256_sub_ps(_mm256_set1_ps(2.0f), e),
                              _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GT_OQ));
  f = _mm256_blendv_ps(f, near, _mm256_cmp_ps(a, _mm256_set1_ps(kErfSplit), _CMP_LE_OQ));
  return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)), f);
}

// The first min(left, 16) lanes.
QPACK_AVX512 inline __mmask16 mask16(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// The lanes of m loaded (zeros elsewhere) / stored, plain moves when m is full:
// on Zen 5 masked moves streaming from or to memory take about twice the time
// of plain ones (bench/masked_moves.c, 64 MB: loads 4.4-4.9 against 1.7-2.8
// ms, 48-byte stores 4.2-4.4 against 1.9-2.0); in L1 they cost the same.
QPACK_AVX512 inline __m512 load16(__mmask16 m, const float* p) {
  return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
QPACK_AVX512 inline void store16(float* p, __mmask16 m, __m512 v) {
  if (m == 0xFFFF) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, m, v);
  }
}

// graph.cc's round_u8 (and quant.cc's quantize): round half to even, + zy,
// clamped to [0, 255], as 32-bit lanes
QPACK_AVX512 inline __m512i round_u8(__m512 v, __m512 zy) {
  v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zy);
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
  return _mm512_cvttps_epi32(v);
}

// round_u8, stored as bytes in the lanes of k
QPACK_AVX512 inline void store_round_u8(__m512 v, __m512 zy, __mmask16 k, uint8_t* y) {
  if (k == 0xFFFF) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y), _mm512_cvtepi32_epi8(round_u8(v, zy)));
  } else {
    _mm512_mask_cvtepi32_storeu_epi8(y, k, round_u8(v, zy));
  }
}

// sigmoid(x) = 1 / (1 + exp(-x)); SiLU = x sigmoid(x); GELU
template <qpack_activation kAct>
QPACK_AVX512 void run512(const float* x, float* y, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 v = load16(m, x + i);
    if (kAct == QPACK_ACT_GELU) {
      store16(y + i, m, gelu512(v));
      continue;
    }
    // one division: x / (1 + exp(-x)) for SiLU, 1 / (1 + exp(-x)) for sigmoid
    const __m512 d = _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), v)));
    store16(y + i, m, _mm512_div_ps(kAct == QPACK_ACT_SILU ? v : one, d));
  }
}

template <qpack_activation kAct>
QPACK_AVX2 void run256(const float* x, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (kAct == QPACK_ACT_GELU) {
      _mm256_storeu_ps(y + i, gelu256(v));
      continue;
    }
    const __m256 d = _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), v)));
    _mm256_storeu_ps(y + i, _mm256_div_ps(kAct == QPACK_ACT_SILU ? v : one, d));
  }
  if (i < n) {  // the tail through a full vector on the stack
    alignas(32) float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
    run256<kAct>(t, t, 8);
    for (int64_t j = i; j < n; ++j) y[j] = t[j - i];
  }
}

QPACK_AVX512 void layer_norm512(const float* x, int64_t rows, int64_t C, const float* w, const float* b,
                                float eps, float* y) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    __m512 s = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; c += 16) s = _mm512_add_ps(s, load16(mask16(C - c), xr + c));
    const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(s) * inv_c);
    __m512 q = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; c += 16) {
      const __mmask16 m = mask16(C - c);
      const __m512 d = _mm512_maskz_sub_ps(m, load16(m, xr + c), mean);
      q = _mm512_fmadd_ps(d, d, q);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(q) * inv_c + eps));
    for (int64_t c = 0; c < C; c += 16) {
      const __mmask16 m = mask16(C - c);
      const __m512 d = _mm512_mul_ps(_mm512_sub_ps(load16(m, xr + c), mean), inv);
      store16(yr + c, m, _mm512_fmadd_ps(d, load16(m, w + c), load16(m, b + c)));
    }
  }
}

QPACK_AVX2 inline float sum256(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 p = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1)));
}

// The AVX2 version: whole vectors of 8, the rest of each row by element.
QPACK_AVX2 void layer_norm256(const float* x, int64_t rows, int64_t C, const float* w, const float* b,
                              float eps, float* y) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const int64_t whole = C / 8 * 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    __m256 s = _mm256_setzero_ps();
    for (int64_t c = 0; c < whole; c += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(xr + c));
    float sum = sum256(s);
    for (int64_t c = whole; c < C; ++c) sum += xr[c];
    const float mf = sum * inv_c;
    const __m256 mean = _mm256_set1_ps(mf);
    __m256 q = _mm256_setzero_ps();
    for (int64_t c = 0; c < whole; c += 8) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(xr + c), mean);
      q = _mm256_fmadd_ps(d, d, q);
    }
    float ss = sum256(q);
    for (int64_t c = whole; c < C; ++c) ss += (xr[c] - mf) * (xr[c] - mf);
    const float invf = 1.0f / std::sqrt(ss * inv_c + eps);
    const __m256 inv = _mm256_set1_ps(invf);
    for (int64_t c = 0; c < whole; c += 8) {
      const __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + c), mean), inv);
      _mm256_storeu_ps(yr + c, _mm256_fmadd_ps(d, _mm256_loadu_ps(w + c), _mm256_loadu_ps(b + c)));
    }
    for (int64_t c = whole; c < C; ++c) yr[c] = (xr[c] - mf) * invf * w[c] + b[c];
  }
}

template <qpack_activation kAct>
bool run_vector(const float* x, float* y, int64_t n) {
  switch (isa_level()) {
    case 2: run512<kAct>(x, y, n); return true;
    case 1: run256<kAct>(x, y, n); return true;
    default: return false;
  }
}

QPACK_AVX512 void quantize512(const float* x, int64_t n, float inv_scale, float zero_point, uint8_t* y) {
  const __m512 inv = _mm512_set1_ps(inv_scale), zp = _mm512_set1_ps(zero_point);
  for (int64_t i = 0; i < n; i += 16) {
    // round the scaled value, then add the zero point (as the scalar loop: exact)
    const __mmask16 m = mask16(n - i);
    store_round_u8(_mm512_mul_ps(load16(m, x + i), inv), zp, m, y + i);
  }
}

// Rows 0..R-1 of x (stride floats apart, n each): x = exp(x - the row's max) in
// place and inv[r] = 1 / the row's sum, the softmax but for that last scale (a
// caller multiplies it into what it computes from the row). The R rows are
// interleaved, R exps in flight: one row of a few hundred keys alone is bound
// by the exp's latency and the reductions' (attention over 196 keys, one Zen 5
// core: 2.2x faster than softmax_row512 a row at a time).
template <int R>
QPACK_AVX512 void exp_rows512(float* x, int64_t stride, int64_t n, float* inv) {
  __m512 mx[R], sum[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    mx[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    sum[r] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = mask16(n - i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) mx[r] = _mm512_max_ps(mx[r], load16(k, x + r * stride + i));
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) mx[r] = _mm512_set1_ps(_mm512_reduce_max_ps(mx[r]));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = mask16(n - i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      float* p = x + r * stride + i;
      const __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(load16(k, p), mx[r])));
      sum[r] = _mm512_add_ps(sum[r], e);
      store16(p, k, e);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) inv[r] = 1.0f / _mm512_reduce_add_ps(sum[r]);
}

// x[i] = exp(x[i] - max) / sum over one row of n floats (a softmax), 16 a step,
// the last under a mask; -inf stays 0 (a masked-out key), a row all -inf
// becomes NaN as PyTorch's softmax makes it: exp_rows512 of the row, then its scale.
QPACK_AVX512 void softmax_row512(float* x, int64_t n) {
  float inv_sum;
  exp_rows512<1>(x, 0, n, &inv_sum);
  const __m512 inv = _mm512_set1_ps(inv_sum);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = mask16(n - i);
    store16(x + i, k, _mm512_mul_ps(load16(k, x + i), inv));
  }
}

// 16 floats of x (the lanes of m; zeros elsewhere) quantized as quantize512:
// their bytes.
QPACK_AVX512 inline __m128i round_u8_16(const float* x, __mmask16 m, __m512 inv, __m512 zp) {
  const __m512 v = load16(m, x);
  return _mm512_cvtepi32_epi8(round_u8(_mm512_mul_ps(v, inv), zp));
}

// Pixels [p0, p1) of an NCHW image of C <= 4 float planes (HW values each)
// quantized into NHWC bytes (an image's 3 channels at a graph's input): 16
// pixels a step, each plane's 16 bytes rounded as quantize512, the C x 16
// bytes interleaved by one byte permute (VBMI) and stored as 16 C bytes.
QPACK_AVX512VBMI void quantize_interleave512(const float* x, int64_t C, int64_t HW, int64_t p0, int64_t p1,
                                             float inv_scale, float zero_point, uint8_t* y) {
  const __m512 inv = _mm512_set1_ps(inv_scale), zp = _mm512_set1_ps(zero_point);
  alignas(64) uint8_t index[64];
  for (int j = 0; j < 64; ++j) index[j] = j < 16 * C ? static_cast<uint8_t>((j % C) * 16 + j / C) : 0;
  const __m512i perm = _mm512_load_si512(index);
  for (int64_t p = p0; p < p1; p += 16) {
    const int64_t n = std::min<int64_t>(16, p1 - p);
    const __mmask16 m = mask16(n);
    const __m128i zero = _mm_setzero_si128();
    __m512i planes = _mm512_castsi128_si512(round_u8_16(x + p, m, inv, zp));
    planes = _mm512_inserti32x4(planes, C > 1 ? round_u8_16(x + HW + p, m, inv, zp) : zero, 1);
    planes = _mm512_inserti32x4(planes, C > 2 ? round_u8_16(x + 2 * HW + p, m, inv, zp) : zero, 2);
    planes = _mm512_inserti32x4(planes, C > 3 ? round_u8_16(x + 3 * HW + p, m, inv, zp) : zero, 3);
    const __m512i pixels = _mm512_permutexvar_epi8(perm, planes);
    uint8_t* o = y + p * C;
    if (n == 16) {  // 16 C bytes in whole 64-, 32- and 16-byte stores
      if (C == 4) {
        _mm512_storeu_si512(o, pixels);
        continue;
      }
      if (C >= 2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_castsi512_si256(pixels));
      if (C == 1) _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm512_castsi512_si128(pixels));
      if (C == 3) _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm512_extracti32x4_epi32(pixels, 2));
      continue;
    }
    const int64_t bytes = n * C;
    _mm512_mask_storeu_epi8(o, (__mmask64(1) << bytes) - 1, pixels);
  }
}

// y = clamp(round_half_even(a x0 + b x1 + c), lo, hi): a u8 add requantized
// (quant.cc's affine2_range, the same rounding; the scalar loop may contract
// differently into FMAs: within one quantum). 16 values per step.
QPACK_AVX512 int64_t affine2_512(const uint8_t* x0, const uint8_t* x1, int64_t n, float a, float b,
                                 float c, uint8_t lo, uint8_t hi, uint8_t* y) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), vc = _mm512_set1_ps(c);
  const __m512i vlo = _mm512_set1_epi32(lo), vhi = _mm512_set1_epi32(hi);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x0 + i))));
    const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x1 + i))));
    const __m512 v = _mm512_fmadd_ps(f0, va, _mm512_fmadd_ps(f1, vb, vc));
    const __m512i q = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), vlo), vhi);  // half to even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(q));
  }
  return i;
}

// Max pooling's vectors: u8 64 channels a vector (AVX-512BW), f32 16.
// max(p, a) is maxps(p, a) = p > a ? p : a for floats, the scalar loop's
// choice in the same order (a NaN in a later pixel does not win).
struct MaxU8x64 {
  using T = uint8_t;
  using V = __m512i;
  using M = __mmask64;
  static constexpr int64_t kLanes = 64;
  QPACK_AVX512BW static M mask(int64_t n) { return (M(1) << n) - 1; }
  QPACK_AVX512BW static V load(const T* p) { return _mm512_loadu_si512(p); }
  QPACK_AVX512BW static V load(M m, const T* p) { return _mm512_maskz_loadu_epi8(m, p); }
  QPACK_AVX512BW static V max(V p, V a) { return _mm512_max_epu8(p, a); }
  QPACK_AVX512BW static void store(T* p, V a) { _mm512_storeu_si512(p, a); }
  QPACK_AVX512BW static void store(M m, T* p, V a) { _mm512_mask_storeu_epi8(p, m, a); }
};
struct MaxF32x16 {
  using T = float;
  using V = __m512;
  using M = __mmask16;
  static constexpr int64_t kLanes = 16;
  QPACK_AVX512 static M mask(int64_t n) { return M((1u << n) - 1); }
  QPACK_AVX512 static V load(const T* p) { return _mm512_loadu_ps(p); }
  QPACK_AVX512 static V load(M m, const T* p) { return _mm512_maskz_loadu_ps(m, p); }
  QPACK_AVX512 static V max(V p, V a) { return _mm512_max_ps(p, a); }
  QPACK_AVX512 static void store(T* p, V a) { _mm512_storeu_ps(p, a); }
  QPACK_AVX512 static void store(M m, T* p, V a) { _mm512_mask_storeu_ps(p, m, a); }
};

// o[c] = the max of the kh x kw pixels of C channels from x (rows `row`
// values apart, pixels C apart), a vector of channels at a time; the last
// ones under a mask (masked loads only there: with a full mask they ran the
// f32 pooling of ResNet-18 at 205 us against 142 with SSE2, one Zen 5 thread).
template <typename K, bool kMasked>
QPACK_AVX512BW inline void max_window_block(const typename K::T* x, int64_t row, int64_t C, int64_t kh,
                                            int64_t kw, typename K::M m, typename K::T* o) {
  auto load = [m](const typename K::T* p) { return kMasked ? K::load(m, p) : K::load(p); };
  typename K::V a = load(x);
  for (int64_t h = 0; h < kh; ++h) {
    for (int64_t w = h == 0 ? 1 : 0; w < kw; ++w) a = K::max(load(x + h * row + w * C), a);
  }
  if (kMasked) {
    K::store(m, o, a);
  } else {
    K::store(o, a);
  }
}

template <typename K>
QPACK_AVX512BW void max_window512(const typename K::T* x, int64_t row, int64_t C, int64_t kh, int64_t kw,
                                  typename K::T* o) {
  int64_t c = 0;
  for (; c + K::kLanes <= C; c += K::kLanes) max_window_block<K, false>(x + c, row, C, kh, kw, 0, o + c);
  if (c < C) max_window_block<K, true>(x + c, row, C, kh, kw, K::mask(C - c), o + c);
}

// y = lut[x], 64 values per step: a byte's low 7 bits index a 128-byte half of
// the table (a two-vector permute for each half), its top bit picks the half.
QPACK_AVX512VBMI void lut512(const uint8_t* lut, const uint8_t* x, int64_t n, uint8_t* y) {
  const __m512i t0 = _mm512_loadu_si512(lut), t1 = _mm512_loadu_si512(lut + 64);
  const __m512i t2 = _mm512_loadu_si512(lut + 128), t3 = _mm512_loadu_si512(lut + 192);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i v = _mm512_loadu_si512(x + i);
    const __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
    _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
  }
  if (i < n) {
    const __mmask64 m = (__mmask64(1) << (n - i)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi8(m, x + i);
    const __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
    _mm512_mask_storeu_epi8(y + i, m, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
  }
}

QPACK_AVX512BW inline __m512 load_u8(__mmask16 k, const uint8_t* x) {
  const __m128i b = k == 0xFFFF ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(x)) : _mm_maskz_loadu_epi8(k, x);
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

// (x - zx) m + b as the scalar loop: a rounded product, then a rounded sum (the
// explicit rounding keeps the compiler from contracting the two into an FMA)
QPACK_AVX512BW inline __m512 affine16(__m512 x, __m512 zx, __m512 m, __m512 b, bool shift) {
  const __m512 p = _mm512_mul_round_ps(_mm512_sub_ps(x, zx), m, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return shift ? _mm512_add_ps(p, b) : p;
}

QPACK_AVX512BW void affine512(const uint8_t* x, int64_t outer, int64_t channels, int64_t inner, const float* m,
                              const float* b, float zx, float zy, uint8_t* y) {
  const __m512 vzx = _mm512_set1_ps(zx), vzy = _mm512_set1_ps(zy), zero = _mm512_setzero_ps();
  const bool shift = b != nullptr;
  if (inner == 1) {  // rows of channels: the channels' vectors of m and b, a masked tail per row
    for (int64_t o = 0; o < outer; ++o) {
      const uint8_t* xr = x + o * channels;
      uint8_t* yr = y + o * channels;
      for (int64_t c = 0; c < channels; c += 16) {
        const __mmask16 k = mask16(channels - c);
        const __m512 vm = load16(k, m + c), vb = shift ? load16(k, b + c) : zero;
        store_round_u8(affine16(load_u8(k, xr + c), vzx, vm, vb, shift), vzy, k, yr + c);
      }
    }
    return;
  }
  for (int64_t r = 0; r < outer * channels; ++r) {  // runs of inner values, one channel's m and b each
    const int64_t c = r % channels;
    const __m512 vm = _mm512_set1_ps(m[c]), vb = shift ? _mm512_set1_ps(b[c]) : zero;
    const uint8_t* xr = x + r * inner;
    uint8_t* yr = y + r * inner;
    for (int64_t i = 0; i < inner; i += 16) {
      const __mmask16 k = mask16(inner - i);
      store_round_u8(affine16(load_u8(k, xr + i), vzx, vm, vb, shift), vzy, k, yr + i);
    }
  }
}

// round_u8((x0 - z0) (x1 - z1) k, zy): the integer product is exact in float, then one product
QPACK_AVX512BW void mul512(const uint8_t* x0, const uint8_t* x1, int64_t n, float z0, float z1, float k,
                           float zy, uint8_t* y) {
  const __m512 vz0 = _mm512_set1_ps(z0), vz1 = _mm512_set1_ps(z1), vk = _mm512_set1_ps(k), vzy = _mm512_set1_ps(zy);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(n - i);
    const __m512 p = _mm512_mul_ps(_mm512_sub_ps(load_u8(m, x0 + i), vz0), _mm512_sub_ps(load_u8(m, x1 + i), vz1));
    store_round_u8(_mm512_mul_ps(p, vk), vzy, m, y + i);
  }
}

QPACK_AVX2 int64_t quantize256(const float* x, int64_t n, float inv_scale, float zero_point, uint8_t* y) {
  const __m256 inv = _mm256_set1_ps(inv_scale), zp = _mm256_set1_ps(zero_point);
  const __m256 lo = _mm256_setzero_ps(), hi = _mm256_set1_ps(255.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(v, zp), lo), hi);
    const __m256i q = _mm256_cvttps_epi32(v);  // 0..255 in each 32-bit lane
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), _mm_packus_epi16(w, w));
  }
  return i;
}

// y = (x - zp) * scale, 8 values per step: the int32 difference converted
// exactly, one float multiply, as graph.cc's scalar dequantize.
QPACK_AVX2 int64_t dequantize256(const uint8_t* x, int64_t n, float scale, int32_t zp, float* y) {
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256i vz = _mm256_set1_epi32(zp);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, vz)), vs));
  }
  return i;
}

// The 8 x 8 floats of r (rows) into d (rows ld apart), transposed.
QPACK_AVX2 inline void store_transposed8x8(__m256* r, float* d, int64_t ld) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(d + i * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(d + (i + 4) * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// The 8 x 8 floats at s (rows ls apart) into d (rows ld apart), transposed.
QPACK_AVX2 inline void transpose8x8(const float* s, int64_t ls, float* d, int64_t ld) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * ls);
  store_transposed8x8(r, d, ld);
}

// The 8 x 8 bytes at s (rows ls apart) dequantized, (x - zp) * scale as
// dequantize256, into d (rows ld apart), transposed.
QPACK_AVX2 inline void dequantize_transpose8x8(const uint8_t* s, int64_t ls, __m256 vs, __m256i vz, float* d,
                                               int64_t ld) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + i * ls)));
    r[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, vz)), vs);
  }
  store_transposed8x8(r, d, ld);
}

// Whole 8 x 8 blocks of rows [r0, r1) of a [rows][cols] matrix, block(r, c)
// for each, in the order the transposes write [cols][rows] fastest: a wide
// matrix (NCHW -> NHWC: few rows of many values) by 64-column strips, so the
// 64 destination rows being filled stay in L1; a tall one by rows of blocks
// across all columns (Zen 4, one thread, against SSE2 4 x 4 blocks: 144 x
// 3136 91 -> 62 us, 3136 x 144 80 -> 55, 32 x 12544 93 -> 44).
template <typename Block>
QPACK_AVX2 inline void for_blocks8x8(int64_t rows, int64_t cols, int64_t r0, int64_t r1, const Block& block) {
  const int64_t c8 = cols / 8 * 8, r8 = r0 + (r1 - r0) / 8 * 8;
  const int64_t strip = cols > rows ? 64 : c8;
  for (int64_t cb = 0; cb < c8; cb += strip) {
    const int64_t ce = std::min(c8, cb + strip);
    for (int64_t r = r0; r < r8; r += 8) {
      for (int64_t c = cb; c < ce; c += 8) block(r, c);
    }
  }
}

// Rows [r0, r1) of s [rows][cols] into d [cols][rows], whole 8 x 8 blocks.
QPACK_AVX2 void transpose256(const float* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* d) {
  for_blocks8x8(rows, cols, r0, r1, [&](int64_t r, int64_t c) QPACK_AVX2 {
    transpose8x8(s + r * cols + c, cols, d + c * rows + r, rows);
  });
}

// transpose256 of u8 data, dequantized on the way.
QPACK_AVX2 void dequantize_transpose256(const uint8_t* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                                        float scale, int32_t zp, float* d) {
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256i vz = _mm256_set1_epi32(zp);
  for_blocks8x8(rows, cols, r0, r1, [&](int64_t r, int64_t c) QPACK_AVX2 {
    dequantize_transpose8x8(s + r * cols + c, cols, vs, vz, d + c * rows + r, rows);
  });
}

}  // namespace

int64_t dequantize_transpose_u8_vector(const uint8_t* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                                       float scale, int32_t zero_point, float* d) {
  if (isa_level() < 1 || cols < 8) return 0;
  dequantize_transpose256(s, rows, cols, r0, r1, scale, zero_point, d);
  return cols / 8 * 8;
}

int64_t dequantize_u8_vector(const uint8_t* x, int64_t n, float scale, int32_t zero_point, float* y) {
  return isa_level() >= 1 ? dequantize256(x, n, scale, zero_point, y) : 0;
}

int64_t transpose_f32_vector(const float* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* d) {
  if (isa_level() < 1 || cols < 8) return 0;
  transpose256(s, rows, cols, r0, r1, d);
  return cols / 8 * 8;
}

int64_t quantize_u8_vector(const float* x, int64_t n, float inv_scale, float zero_point, uint8_t* y) {
  switch (isa_level()) {
    case 2: quantize512(x, n, inv_scale, zero_point, y); return n;
    case 1: return quantize256(x, n, inv_scale, zero_point, y);
    default: return 0;
  }
}

int64_t affine2_u8_vector(const uint8_t* x0, const uint8_t* x1, int64_t n, float a, float b, float c,
                          uint8_t lo, uint8_t hi, uint8_t* y) {
  return isa_level() == 2 ? affine2_512(x0, x1, n, a, b, c, lo, hi, y) : 0;
}

bool max_window_vector(const uint8_t* x, int64_t row, int64_t C, int64_t kh, int64_t kw, uint8_t* o) {
  if (!has_avx512bw()) return false;
  max_window512<MaxU8x64>(x, row, C, kh, kw, o);
  return true;
}

bool max_window_vector(const float* x, int64_t row, int64_t C, int64_t kh, int64_t kw, float* o) {
  if (!has_avx512bw()) return false;  // the template's target: F with BW and VL
  max_window512<MaxF32x16>(x, row, C, kh, kw, o);
  return true;
}

bool quantize_interleave_u8_vectorized(int64_t C) { return has_vbmi() && C >= 1 && C <= 4; }

bool vec_math_avx512() { return isa_level() == 2; }

bool softmax_row_f32_vector(float* x, int64_t n) {
  if (isa_level() != 2) return false;
  softmax_row512(x, n);
  return true;
}

bool exp_rows_f32_vector(float* x, int rows, int64_t stride, int64_t n, float* inv) {
  if (isa_level() != 2) return false;
  switch (rows) {
    case 4: exp_rows512<4>(x, stride, n, inv); return true;
    case 3: exp_rows512<3>(x, stride, n, inv); return true;
    case 2: exp_rows512<2>(x, stride, n, inv); return true;
    case 1: exp_rows512<1>(x, stride, n, inv); return true;
    default: return false;
  }
}

bool quantize_interleave_u8_vector(const float* x, int64_t C, int64_t HW, int64_t p0, int64_t p1, float inv_scale,
                                   float zero_point, uint8_t* y) {
  if (!quantize_interleave_u8_vectorized(C)) return false;
  quantize_interleave512(x, C, HW, p0, p1, inv_scale, zero_point, y);
  return true;
}

int64_t lut_u8_vector(const uint8_t* lut, const uint8_t* x, int64_t n, uint8_t* y) {
  if (!has_vbmi()) return 0;
  lut512(lut, x, n, y);
  return n;
}

bool affine_u8_vector(const uint8_t* x, int64_t outer, int64_t channels, int64_t inner, const float* m,
                      const float* b, float zx, float zy, uint8_t* y) {
  if (!has_avx512bw()) return false;
  affine512(x, outer, channels, inner, m, b, zx, zy, y);
  return true;
}

bool mul_u8_vector(const uint8_t* x0, const uint8_t* x1, int64_t n, float z0, float z1, float k, float zy,
                   uint8_t* y) {
  if (!has_avx512bw()) return false;
  mul512(x0, x1, n, z0, z1, k, zy, y);
  return true;
}

bool layer_norm_f32_vector(const float* x, int64_t rows, int64_t C, const float* w, const float* b, float eps,
                           float* y) {
  switch (isa_level()) {
    case 2: layer_norm512(x, rows, C, w, b, eps, y); return true;
    case 1: layer_norm256(x, rows, C, w, b, eps, y); return true;
    default: return false;
  }
}

bool activate_f32_vectorized(qpack_activation act) {
  return isa_level() > 0 && (act == QPACK_ACT_SIGMOID || act == QPACK_ACT_SILU || act == QPACK_ACT_GELU);
}

bool activate_f32_vector(qpack_activation act, const float* x, float* y, int64_t n) {
  switch (act) {
    case QPACK_ACT_SIGMOID: return run_vector<QPACK_ACT_SIGMOID>(x, y, n);
    case QPACK_ACT_SILU: return run_vector<QPACK_ACT_SILU>(x, y, n);
    case QPACK_ACT_GELU: return run_vector<QPACK_ACT_GELU>(x, y, n);
    default: return false;
  }
}

#else

bool activate_f32_vector(qpack_activation, const float*, float*, int64_t) { return false; }
bool activate_f32_vectorized(qpack_activation) { return false; }
bool layer_norm_f32_vector(const float*, int64_t, int64_t, const float*, const float*, float, float*) {
  return false;
}
int64_t quantize_u8_vector(const float*, int64_t, float, float, uint8_t*) { return 0; }
int64_t dequantize_u8_vector(const uint8_t*, int64_t, float, int32_t, float*) { return 0; }
int64_t transpose_f32_vector(const float*, int64_t, int64_t, int64_t, int64_t, float*) { return 0; }
int64_t dequantize_transpose_u8_vector(const uint8_t*, int64_t, int64_t, int64_t, int64_t, float, int32_t, float*) {
  return 0;
}
int64_t affine2_u8_vector(const uint8_t*, const uint8_t*, int64_t, float, float, float, uint8_t,
                          uint8_t, uint8_t*) {
  return 0;
}
int64_t lut_u8_vector(const uint8_t*, const uint8_t*, int64_t, uint8_t*) { return 0; }
bool quantize_interleave_u8_vectorized(int64_t) { return false; }
bool softmax_row_f32_vector(float*, int64_t) { return false; }
bool exp_rows_f32_vector(float*, int, int64_t, int64_t, float*) { return false; }
bool vec_math_avx512() { return false; }
bool quantize_interleave_u8_vector(const float*, int64_t, int64_t, int64_t, int64_t, float, float, uint8_t*) {
  return false;
}
bool max_window_vector(const uint8_t*, int64_t, int64_t, int64_t, int64_t, uint8_t*) { return false; }
bool max_window_vector(const float*, int64_t, int64_t, int64_t, int64_t, float*) { return false; }
bool affine_u8_vector(const uint8_t*, int64_t, int64_t, int64_t, const float*, const float*, float, float,
                      uint8_t*) {
  return false;
}
bool mul_u8_vector(const uint8_t*, const uint8_t*, int64_t, float, float, float, float, uint8_t*) { return false; }

#endif

}  // namespace qpack
