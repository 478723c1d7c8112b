#include "backends/onednn/gemv_u8.h"

#include <algorithm>

#include "core/parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_GEMV_X86 1
#endif

namespace qpack {
namespace onednn_rt {

void gemv_u8_weight_sums(const int8_t* w, int64_t N, int64_t K, int32_t* sums) {
  for (int64_t n = 0; n < N; ++n) {
    int32_t s = 0;
    for (int64_t k = 0; k < K; ++k) s += w[n * K + k];
    sums[n] = s;
  }
}

#ifdef QPACK_GEMV_X86
namespace {

#define QPACK_GEMV_TARGET __attribute__((target("avx2,fma")))

// The four int32 lanes of a's and b's and c's and d's 8 lanes summed: {sum a,
// sum b, sum c, sum d}.
QPACK_GEMV_TARGET inline __m128i sum4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_hadd_epi32(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256i cd = _mm256_hadd_epi32(c, d);
  const __m256i abcd = _mm256_hadd_epi32(ab, cd);  // a b c d (low half) | a b c d (high half)
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// 32 u8 x s8 products summed in pairs (int16, exact on narrow weights), then
// in fours: 8 int32 lanes.
QPACK_GEMV_TARGET inline __m256i dot32(__m256i xv, const int8_t* w, __m256i ones) {
  const __m256i p = _mm256_maddubs_epi16(xv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm256_madd_epi16(p, ones);
}

// Outputs [n0, n1) of one row x: four at a time, 32 inputs per step.
QPACK_GEMV_TARGET void row(const GemvU8& a, const uint8_t* x, int64_t n0, int64_t n1, int32_t* acc) {
  const int64_t K = a.K, K32 = K / 32 * 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const int32_t zp = a.src_zero_point;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const int8_t* w0 = a.w + n * K;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t k = 0; k < K32; k += 32) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k));
      s0 = _mm256_add_epi32(s0, dot32(xv, w0 + k, ones));
      s1 = _mm256_add_epi32(s1, dot32(xv, w0 + K + k, ones));
      s2 = _mm256_add_epi32(s2, dot32(xv, w0 + 2 * K + k, ones));
      s3 = _mm256_add_epi32(s3, dot32(xv, w0 + 3 * K + k, ones));
    }
    alignas(16) int32_t s[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(s), sum4(s0, s1, s2, s3));
    for (int j = 0; j < 4; ++j) {
      for (int64_t k = K32; k < K; ++k) s[j] += int32_t(x[k]) * w0[j * K + k];
      acc[n + j] = s[j] - zp * a.weight_sums[n + j];
    }
  }
  for (; n < n1; ++n) {
    int32_t s = 0;
    for (int64_t k = 0; k < K; ++k) s += int32_t(x[k]) * a.w[n * K + k];
    acc[n] = s - zp * a.weight_sums[n];
  }
}

// Outputs [n0, n1) of two rows x0, x1 (K apart): each weight load serves both.
QPACK_GEMV_TARGET void rows2(const GemvU8& a, const uint8_t* x0, int64_t n0, int64_t n1, int32_t* acc0) {
  const int64_t K = a.K, K32 = K / 32 * 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const int32_t zp = a.src_zero_point;
  const uint8_t* x1 = x0 + K;
  int32_t* acc1 = acc0 + a.N;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const int8_t* w0 = a.w + n * K;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;
    for (int64_t k = 0; k < K32; k += 32) {
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + k));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1 + k));
      __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + k));
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(xa, w), ones));
      t0 = _mm256_add_epi32(t0, _mm256_madd_epi16(_mm256_maddubs_epi16(xb, w), ones));
      w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + K + k));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(xa, w), ones));
      t1 = _mm256_add_epi32(t1, _mm256_madd_epi16(_mm256_maddubs_epi16(xb, w), ones));
      w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + 2 * K + k));
      s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_maddubs_epi16(xa, w), ones));
      t2 = _mm256_add_epi32(t2, _mm256_madd_epi16(_mm256_maddubs_epi16(xb, w), ones));
      w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + 3 * K + k));
      s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_maddubs_epi16(xa, w), ones));
      t3 = _mm256_add_epi32(t3, _mm256_madd_epi16(_mm256_maddubs_epi16(xb, w), ones));
    }
    alignas(16) int32_t s[4], t[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(s), sum4(s0, s1, s2, s3));
    _mm_store_si128(reinterpret_cast<__m128i*>(t), sum4(t0, t1, t2, t3));
    for (int j = 0; j < 4; ++j) {
      for (int64_t k = K32; k < K; ++k) {
        s[j] += int32_t(x0[k]) * w0[j * K + k];
        t[j] += int32_t(x1[k]) * w0[j * K + k];
      }
      acc0[n + j] = s[j] - zp * a.weight_sums[n + j];
      acc1[n + j] = t[j] - zp * a.weight_sums[n + j];
    }
  }
  if (n < n1) {
    row(a, x0, n, n1, acc0);
    row(a, x1, n, n1, acc1);
  }
}

}  // namespace

bool gemv_u8_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

void gemv_u8(const GemvU8& a, int threads) {
  constexpr int64_t kBlockBytes = 128 * 1024;
  // Output blocks of 4 per part; a part below 64 outputs x 512 inputs is not
  // worth waking a thread for.
  const int64_t blocks = (a.N + 3) / 4;
  const int64_t grain = a.K >= 512 ? 16 : 64;
  parallel_chunks(blocks, grain, threads, [&](int, int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * 4, n1 = b1 * 4 < a.N ? b1 * 4 : a.N;
    // blocks of outputs whose weights stay in L2 while every row passes over them
    const int64_t nb = std::max<int64_t>(4, (kBlockBytes / std::max<int64_t>(a.K, 1)) / 4 * 4);
    for (int64_t b = n0; b < n1; b += nb) {
      const int64_t e = std::min(n1, b + nb);
      int64_t m = 0;
      for (; m + 2 <= a.M; m += 2) rows2(a, a.x + m * a.K, b, e, a.acc + m * a.N);
      if (m < a.M) row(a, a.x + m * a.K, b, e, a.acc + m * a.N);
    }
  });
}

#else  // not x86-64: oneDNN runs

bool gemv_u8_available() { return false; }
void gemv_u8(const GemvU8&, int) {}

#endif

}  // namespace onednn_rt
}  // namespace qpack
