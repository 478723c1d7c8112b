#include "backends/onednn/gemm_f32.h"

#include <algorithm>

#include "core/parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_GEMM_F32_X86 1
#endif

namespace qpack {
namespace onednn_rt {

// The input rows of a tile are re-read from L2 for every C outputs: all rows
// together within 256 KB.
bool gemm_f32_fits(int64_t M, int64_t K) {
  return M >= 1 && M <= kGemmF32MaxRows && M * K * 4 <= (int64_t(256) << 10);
}

#ifdef QPACK_GEMM_F32_X86
namespace {

#define QPACK_GEMM_F32_TARGET __attribute__((target("avx2,fma")))

// The 8 lanes of each of a, b, c, d summed: {sum a, sum b, sum c, sum d}.
QPACK_GEMM_F32_TARGET inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a b c d (low half) | a b c d (high half)
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// One step of 8 inputs (the last K % 8 through the mask) of a tile of R rows
// x C outputs.
template <int R, int C, bool kMasked>
QPACK_GEMM_F32_TARGET __attribute__((always_inline)) inline void step(
    const float* x, const float* w, int64_t K, int64_t k, __m256i tail, __m256 (&s)[R][C]) {
  __m256 xv[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    xv[r] = kMasked ? _mm256_maskload_ps(x + r * K + k, tail) : _mm256_loadu_ps(x + r * K + k);
  }
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) {
    const __m256 wv = kMasked ? _mm256_maskload_ps(w + c * K + k, tail) : _mm256_loadu_ps(w + c * K + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) s[r][c] = _mm256_fmadd_ps(xv[r], wv, s[r][c]);
  }
}

// Rows [m0, m0 + R) x outputs [n0, n0 + C), C <= 4, then bias and clamp.
template <int R, int C>
QPACK_GEMM_F32_TARGET void tile(const GemmF32& a, int64_t m0, int64_t n0, __m256i tail) {
  static_assert(C >= 1 && C <= 4, "one group of 4 lane sums");
  const int64_t K = a.K, K8 = K / 8 * 8;
  const float* x = a.x + m0 * K;
  const float* w = a.w + n0 * K;
  __m256 s[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) s[r][c] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < K8; k += 8) step<R, C, false>(x, w, K, k, tail, s);
  if (K8 < K) step<R, C, true>(x, w, K, K8, tail, s);
  const __m128 lo = _mm_set1_ps(a.lo), hi = _mm_set1_ps(a.hi);
  const __m256 zero = _mm256_setzero_ps();
  float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (a.bias != nullptr) std::copy(a.bias + n0, a.bias + n0 + C, b);
  const __m128 bias = _mm_loadu_ps(b);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m128 sums = sum4(s[r][0], C > 1 ? s[r][1] : zero, C > 2 ? s[r][2] : zero, C > 3 ? s[r][3] : zero);
    // max / min return their second operand when one is NaN: NaN passes, and an
    // unset bound (-inf / inf) changes nothing
    const __m128 v = _mm_min_ps(hi, _mm_max_ps(lo, _mm_add_ps(sums, bias)));
    float* y = a.y + (m0 + r) * a.N + n0;
    if (C == 4) {
      _mm_storeu_ps(y, v);
    } else {
      float out[4];
      _mm_storeu_ps(out, v);
      std::copy(out, out + C, y);
    }
  }
}

// Every row tile (R rows, then the last M % R) over outputs [n0, n0 + C).
template <int R, int C>
QPACK_GEMM_F32_TARGET void columns(const GemmF32& a, int64_t n0, __m256i tail) {
  int64_t m = 0;
  for (; m + R <= a.M; m += R) tile<R, C>(a, m, n0, tail);
  for (; m + 2 <= a.M; m += 2) tile<2, C>(a, m, n0, tail);
  if (m < a.M) tile<1, C>(a, m, n0, tail);
}

// Outputs [n0, n1): tiles of C, the last N % C one by one.
template <int R, int C>
QPACK_GEMM_F32_TARGET void run(const GemmF32& a, int64_t n0, int64_t n1) {
  alignas(32) int32_t lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = i < a.K % 8 ? -1 : 0;
  const __m256i tail = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
  int64_t n = n0;
  for (; n + C <= n1; n += C) columns<R, C>(a, n, tail);
  for (; n < n1; ++n) columns<R, 1>(a, n, tail);
}

template <int R, int C>
void run_parallel(const GemmF32& a, int threads) {
  // parts of whole tiles of outputs, about 256K multiply-adds each at least
  const int64_t blocks = (a.N + C - 1) / C;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, a.M * a.K * C));
  parallel_chunks(blocks, grain, threads, [&](int, int64_t b, int64_t e) {
    run<R, C>(a, b * C, std::min(a.N, e * C));
  });
}

}  // namespace

// Tiles of 3 rows x 4 outputs: 12 accumulators, 3 inputs and a weight in
// the 16 ymm registers. Against 2 x 6 and 2 x 4 (Zen 3, 1 thread,
// 32x1024x4096): 1.2x and 1.2x faster; 1 x 8 for a single row: the same.
void gemm_f32(const GemmF32& a, int threads) { run_parallel<3, 4>(a, threads); }

#else  // not x86-64: own_avx2_available() is false, oneDNN runs

void gemm_f32(const GemmF32&, int) {}

#endif

}  // namespace onednn_rt
}  // namespace qpack
