#include "backends/onednn/gemv_f32.h"

#include <algorithm>

#include "backends/onednn/own_u8.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_GEMV_F32_X86 1
#endif

namespace qpack {
namespace onednn_rt {

bool gemv_f32_layout(const BlockedLayout& l, int64_t K, int64_t N, int64_t* nstride, int64_t* kstride) {
#ifdef QPACK_GEMV_F32_X86
  static const bool cpu = __builtin_cpu_supports("avx512f");
#else
  const bool cpu = false;
#endif
  if (!cpu || !isa_has_avx512_core() || l.data_type != static_cast<uint32_t>(dnnl::memory::data_type::f32) ||
      l.ndims != 2 || l.dims[0] != K || l.dims[1] != N || l.nblks != 2 || l.blks[0] != 16 ||
      l.blks[1] != 64 || l.idxs[0] != 0 || l.idxs[1] != 1) {
    return false;
  }
  if (l.strides[0] < 1024 || l.strides[1] < 1024) return false;
  *kstride = l.strides[0];
  *nstride = l.strides[1];
  return true;
}

#ifdef QPACK_GEMV_F32_X86
namespace {

#define QPACK_GEMV_F32_TARGET __attribute__((target("avx512f")))

// Outputs [64 nb, 64 nb + 64) of R rows from x (K apart; N apart at y).
template <int R>
QPACK_GEMV_F32_TARGET void block(const GemvF32& a, const float* x, int64_t nb, float* y) {
  __m512 s[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) s[r][j] = _mm512_setzero_ps();
  }
  const float* wn = a.w + nb * a.nstride;
  const int64_t K = a.K;
  for (int64_t kb = 0; kb < K; kb += 16) {
    const float* wb = wn + (kb / 16) * a.kstride;
    const int64_t ke = std::min<int64_t>(16, K - kb);
    for (int64_t k = 0; k < ke; ++k) {
      const float* p = wb + k * 64;
      const __m512 w0 = _mm512_loadu_ps(p), w1 = _mm512_loadu_ps(p + 16);
      const __m512 w2 = _mm512_loadu_ps(p + 32), w3 = _mm512_loadu_ps(p + 48);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * K + kb + k]);
        s[r][0] = _mm512_fmadd_ps(xb, w0, s[r][0]);
        s[r][1] = _mm512_fmadd_ps(xb, w1, s[r][1]);
        s[r][2] = _mm512_fmadd_ps(xb, w2, s[r][2]);
        s[r][3] = _mm512_fmadd_ps(xb, w3, s[r][3]);
      }
    }
  }
  const __m512 lo = _mm512_set1_ps(a.lo), hi = _mm512_set1_ps(a.hi);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int64_t n0 = nb * 64 + 16 * j;
    if (n0 >= a.N) break;
    const __mmask16 m = _cvtu32_mask16(lanes16(0, a.N - n0));
    const __m512 b = a.bias != nullptr ? _mm512_maskz_loadu_ps(m, a.bias + n0) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // NaN passes (max and min return their second operand when one is NaN)
      const __m512 v = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_add_ps(s[r][j], b)));
      _mm512_mask_storeu_ps(y + r * a.N + n0, m, v);
    }
  }
}

}  // namespace

void gemv_f32(const GemvF32& a, int threads) {
  for_gemv_blocks(a.M, a.K, a.N, 256, threads, [&](auto rows, int64_t m, int64_t nb) {
    block<decltype(rows)::value>(a, a.x + m * a.K, nb, a.y + m * a.N);
  });
}

#else  // not x86-64: oneDNN runs

void gemv_f32(const GemvF32&, int) {}

#endif

}  // namespace onednn_rt
}  // namespace qpack
