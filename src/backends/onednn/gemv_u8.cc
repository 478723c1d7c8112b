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
// in fours, added to 8 int32 lanes.
QPACK_GEMV_TARGET inline __m256i dot32(__m256i sum, __m256i xv, __m256i wv, __m256i ones) {
  return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, wv), ones));
}

// Outputs [n0, n1) of R rows (K apart, from x; their sums N apart, from acc):
// four outputs at a time, 32 inputs per step, each weight load serving the R
// rows; the last outputs off a multiple of 4 one by one.
template <int R>
QPACK_GEMV_TARGET void rows(const GemvU8& a, const uint8_t* x, int64_t n0, int64_t n1, int32_t* acc) {
  const int64_t K = a.K, K32 = K / 32 * 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const int32_t zp = a.src_zero_point;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const int8_t* w0 = a.w + n * K;
    __m256i s[R][4];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) s[r][j] = _mm256_setzero_si256();
    }
    for (int64_t k = 0; k < K32; k += 32) {
      __m256i xv[R];
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * K + k));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + j * K + k));
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) s[r][j] = dot32(s[r][j], xv[r], wv, ones);
      }
    }
    for (int r = 0; r < R; ++r) {
      alignas(16) int32_t t[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(t), sum4(s[r][0], s[r][1], s[r][2], s[r][3]));
      for (int j = 0; j < 4; ++j) {
        for (int64_t k = K32; k < K; ++k) t[j] += int32_t(x[r * K + k]) * w0[j * K + k];
        acc[r * a.N + n + j] = t[j] - zp * a.weight_sums[n + j];
      }
    }
  }
  for (; n < n1; ++n) {
    for (int r = 0; r < R; ++r) {
      int32_t t = 0;
      for (int64_t k = 0; k < K; ++k) t += int32_t(x[r * K + k]) * a.w[n * K + k];
      acc[r * a.N + n] = t - zp * a.weight_sums[n];
    }
  }
}

}  // namespace

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
      for (; m + 2 <= a.M; m += 2) rows<2>(a, a.x + m * a.K, b, e, a.acc + m * a.N);
      if (m < a.M) rows<1>(a, a.x + m * a.K, b, e, a.acc + m * a.N);
    }
  });
}

#else  // not x86-64: oneDNN runs

void gemv_u8(const GemvU8&, int) {}

#endif

}  // namespace onednn_rt
}  // namespace qpack
