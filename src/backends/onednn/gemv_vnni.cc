#include "backends/onednn/gemv_vnni.h"

#include <algorithm>
#include <cstring>

#include "backends/onednn/own_u8.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_GEMV_VNNI_X86 1
#endif

namespace qpack {
namespace onednn_rt {

namespace {

inline int64_t offset(const GemvVnni& a, int64_t k, int64_t n) {
  return (n / 64) * a.nstride + (k / 64) * a.kstride + ((k % 64) / 4) * 256 + (n % 64) * 4 + k % 4;
}

}  // namespace

bool gemv_vnni_layout(const BlockedLayout& l, int64_t K, int64_t N, int64_t* nstride, int64_t* kstride) {
  if (!own_u8_available() || l.data_type != static_cast<uint32_t>(dnnl::memory::data_type::s8) ||
      l.ndims != 2 || l.dims[0] != K || l.dims[1] != N || l.nblks != 3 || l.blks[0] != 16 ||
      l.blks[1] != 64 || l.blks[2] != 4 || l.idxs[0] != 0 || l.idxs[1] != 1 || l.idxs[2] != 0) {
    return false;
  }
  if (l.strides[0] < 4096 || l.strides[1] < 4096) return false;
  *kstride = l.strides[0];
  *nstride = l.strides[1];
  return true;
}

void gemv_vnni_weight_sums(const GemvVnni& a, int32_t* sums) {
  for (int64_t n = 0; n < a.N; ++n) {
    int32_t s = 0;
    for (int64_t k = 0; k < a.K; ++k) s += a.w[offset(a, k, n)];
    sums[n] = s;
  }
}

#ifdef QPACK_GEMV_VNNI_X86
namespace {

#define QPACK_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// Input bytes [k, k + 4) of a row as one int32, zeros past K.
inline int32_t four(const uint8_t* row, int64_t k, int64_t K) {
  int32_t v = 0;
  if (k + 4 <= K) {
    std::memcpy(&v, row + k, 4);
  } else {
    uint8_t b[4] = {0, 0, 0, 0};
    for (int64_t i = k; i < K; ++i) b[i - k] = row[i];
    std::memcpy(&v, b, 4);
  }
  return v;
}

// Outputs [64 nb, 64 nb + 64) of R rows from x (K apart; sums N apart at acc).
template <int R>
QPACK_VNNI_TARGET void block(const GemvVnni& a, const uint8_t* x, int64_t nb, int32_t* acc) {
  __m512i s[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) s[r][j] = _mm512_setzero_si512();
  }
  const int8_t* wn = a.w + nb * a.nstride;
  const int64_t K = a.K, groups = (K + 3) / 4, whole = K / 4;
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* p = wn + (g / 16) * a.kstride + (g % 16) * 256;
    const __m512i w0 = _mm512_loadu_si512(p), w1 = _mm512_loadu_si512(p + 64);
    const __m512i w2 = _mm512_loadu_si512(p + 128), w3 = _mm512_loadu_si512(p + 192);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      int32_t v;
      if (g < whole) {
        std::memcpy(&v, x + r * K + 4 * g, 4);
      } else {
        v = four(x + r * K, 4 * g, K);
      }
      const __m512i xb = _mm512_set1_epi32(v);
      s[r][0] = _mm512_dpbusd_epi32(s[r][0], xb, w0);
      s[r][1] = _mm512_dpbusd_epi32(s[r][1], xb, w1);
      s[r][2] = _mm512_dpbusd_epi32(s[r][2], xb, w2);
      s[r][3] = _mm512_dpbusd_epi32(s[r][3], xb, w3);
    }
  }
  const __m512i zp = _mm512_set1_epi32(a.src_zero_point);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int64_t n0 = nb * 64 + 16 * j;
    if (n0 >= a.N) break;
    const __mmask16 m = _cvtu32_mask16(lanes16(0, a.N - n0));
    const __m512i zs = _mm512_mullo_epi32(zp, _mm512_maskz_loadu_epi32(m, a.weight_sums + n0));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_epi32(acc + r * a.N + n0, m, _mm512_sub_epi32(s[r][j], zs));
  }
}

}  // namespace

void gemv_vnni(const GemvVnni& a, int threads) {
  for_gemv_blocks(a.M, a.K, a.N, 512, threads, [&](auto rows, int64_t m, int64_t nb) {
    block<decltype(rows)::value>(a, a.x + m * a.K, nb, a.acc + m * a.N);
  });
}

#else  // not x86-64: oneDNN runs

void gemv_vnni(const GemvVnni&, int) {}

#endif

}  // namespace onednn_rt
}  // namespace qpack
