#include "backends/onednn/depthwise_nchw_f32.h"

#include <algorithm>
#include <cstring>

#include "backends/onednn/own_u8.h"
#include "backends/onednn/runtime.h"
#include "core/parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_DWN_X86 1
#endif

namespace qpack {
namespace onednn_rt {

#ifdef QPACK_DWN_X86
namespace {

#define QPACK_DWN_TARGET __attribute__((target("avx2,fma")))
// Short loops of vector stores stay loops: GCC would make a call to memset
// of them, which costs more than these rows' work.
#if defined(__GNUC__) && !defined(__clang__)
#define QPACK_DWN_NO_LIBCALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define QPACK_DWN_NO_LIBCALLS
#endif

constexpr int64_t kMaxTaps = 64;

// Channel c's tap (0, 0); tap (kh, kw) is kh * wsh + kw * wsw on from it.
inline const float* channel_weights(const DepthwiseNchwF32& a, int64_t c) {
  return a.w + (a.cblock > 0 ? (c / a.cblock) * a.cstride + c % a.cblock : c * a.cstride);
}

// The padded plane: row r is input row r - PT, column q input column q - PL,
// zeros outside the input. Wide enough for the last 8-pixel step of a row to
// read whole vectors, rounded up to whole vectors.
struct Padded {
  int64_t rows, cols;
  size_t bytes() const { return static_cast<size_t>(rows * cols + 8) * sizeof(float); }
};

Padded padded_size(const DepthwiseNchwF32& a) {
  const int64_t ow8 = (a.OW + 7) / 8 * 8;
  const int64_t cols = (ow8 - 8) * a.SW + (a.KW - 1) * a.DW + 8 * a.SW;
  return Padded{(a.OH - 1) * a.SH + (a.KH - 1) * a.DH + 1, (cols + 7) / 8 * 8};
}

// Fills the padded plane of x by whole vectors (a call to memcpy / memset per
// row cost more than the row's work on small planes; and no masked moves:
// AMD's AVX2 ones are microcoded).
QPACK_DWN_TARGET QPACK_DWN_NO_LIBCALLS void fill_padded(const DepthwiseNchwF32& a, const float* x, Padded p,
                                                        float* out) {
  const __m256 zero = _mm256_setzero_ps();
  const int64_t cols = std::max<int64_t>(0, std::min(a.W, p.cols - a.PL));  // input columns kept
  const int64_t left = std::min(a.PL, p.cols);
  for (int64_t r = 0; r < p.rows; ++r) {
    float* d = out + r * p.cols;
    const int64_t ih = r - a.PT;
    if (ih < 0 || ih >= a.H || cols == 0) {
      for (int64_t q = 0; q < p.cols; q += 8) _mm256_storeu_ps(d + q, zero);
      continue;
    }
    // zeros over the row (the buffer has 8 floats of slack), then the input
    for (int64_t q = 0; q < left; q += 8) _mm256_storeu_ps(d + q, zero);
    for (int64_t q = (left + cols) / 8 * 8; q < p.cols; q += 8) _mm256_storeu_ps(d + q, zero);
    const float* s = x + ih * a.W;
    int64_t q = 0;
    for (; q + 8 <= cols; q += 8) _mm256_storeu_ps(d + left + q, _mm256_loadu_ps(s + q));
    for (; q < cols; ++q) d[left + q] = s[q];
  }
}

// 8 output columns' inputs from p: p[0..7] (stride 1) or p[0, 2, .., 14] (stride 2).
template <int S>
QPACK_DWN_TARGET inline __m256 columns(const float* p) {
  if (S == 1) return _mm256_loadu_ps(p);
  const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  // a0 a2 b0 b2 | a4 a6 b4 b6, then the middle 64-bit pairs swapped
  const __m256 even = _mm256_shuffle_ps(a, b, 0x88);
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8));
}

// R rows x V vectors of 8 outputs from q (the window's top-left input of
// the first; rows row_in floats apart there, OW apart at out): R x V
// independent sums, enough of them (up to 12) for two FMAs a cycle, each
// tap's weight broadcast once for all. Clamped; of each row's last vector
// only its first `partial` lanes stored when that is not 0 (no masked
// store: AMD's is microcoded).
template <int S, int K, int R, int V>
QPACK_DWN_TARGET inline void step(const float* q, int64_t row_in, float* out, int64_t OW, int64_t partial,
                                  int64_t KH, int64_t KW, int64_t step_h, int64_t step_w, const float* w,
                                  __m256 bias, __m256 lo, __m256 hi) {
  __m256 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = bias;
  }
#pragma GCC unroll 8
  for (int64_t kh = 0; kh < KH; ++kh) {
#pragma GCC unroll 8
    for (int64_t kw = 0; kw < KW; ++kw) {
      const float* t = q + kh * step_h + kw * step_w;
      const __m256 wv = _mm256_broadcast_ss(w + kh * KW + kw);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) {
          acc[r][v] = _mm256_fmadd_ps(columns<S>(t + r * row_in + v * 8 * S), wv, acc[r][v]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __m256 y = _mm256_min_ps(hi, _mm256_max_ps(lo, acc[r][v]));  // NaN passes
      float* d = out + r * OW + v * 8;
      if (v == V - 1 && partial > 0) {
        alignas(32) float t[8];
        _mm256_store_ps(t, y);
        for (int64_t i = 0; i < partial; ++i) d[i] = t[i];
      } else {
        _mm256_storeu_ps(d, y);
      }
    }
  }
}

// step<S, K, R, v> for v = 1..4 vectors
template <int S, int K, int R>
QPACK_DWN_TARGET inline void step_v(int64_t v, const float* q, int64_t row_in, float* out, int64_t OW,
                                    int64_t partial, int64_t KH, int64_t KW, int64_t step_h, int64_t step_w,
                                    const float* w, __m256 bias, __m256 lo, __m256 hi) {
  switch (v) {
    case 4: step<S, K, R, 4>(q, row_in, out, OW, partial, KH, KW, step_h, step_w, w, bias, lo, hi); break;
    case 3: step<S, K, R, 3>(q, row_in, out, OW, partial, KH, KW, step_h, step_w, w, bias, lo, hi); break;
    case 2: step<S, K, R, 2>(q, row_in, out, OW, partial, KH, KW, step_h, step_w, w, bias, lo, hi); break;
    default: step<S, K, R, 1>(q, row_in, out, OW, partial, KH, KW, step_h, step_w, w, bias, lo, hi); break;
  }
}

// One channel's output plane from its padded plane P (Wp floats a row); K:
// a KxK window known at compile time, 0 for any. Tiles of 3 rows x up to 4
// vectors (32 pixels).
template <int S, int K>
QPACK_DWN_TARGET void plane(const DepthwiseNchwF32& a, const float* P, int64_t Wp, const float* w, __m256 bias,
                            __m256 lo, __m256 hi, float* y) {
  const int64_t KH = K ? K : a.KH, KW = K ? K : a.KW;
  const int64_t step_h = a.DH * Wp, step_w = a.DW;
  const int64_t OH = a.OH, OW = a.OW, rem = OW % 8;
  const int64_t row_in = a.SH * Wp;
  for (int64_t oh = 0; oh < OH; oh += 3) {
    const int64_t rows = std::min<int64_t>(3, OH - oh);
    // A row's last vector stored whole runs on into the next row: fine when
    // that one is stored after it (one tile a row: the rows go in order) and
    // within the plane (the next may be another thread's).
    const int64_t partial = OW > 32 || (OH - oh - rows) * OW < 8 - rem ? rem : 0;
    for (int64_t ow = 0; ow < OW; ow += 32) {
      const int64_t v = std::min<int64_t>(4, (OW - ow + 7) / 8);
      const int64_t part = ow + 32 >= OW ? partial : 0;
      const float* q = P + oh * row_in + ow * S;
      float* out = y + oh * OW + ow;
      if (rows == 3) {
        step_v<S, K, 3>(v, q, row_in, out, OW, part, KH, KW, step_h, step_w, w, bias, lo, hi);
      } else if (rows == 2) {
        step_v<S, K, 2>(v, q, row_in, out, OW, part, KH, KW, step_h, step_w, w, bias, lo, hi);
      } else {
        step_v<S, K, 1>(v, q, row_in, out, OW, part, KH, KW, step_h, step_w, w, bias, lo, hi);
      }
    }
  }
}

// Planes [p0, p1): the next one's padded copy made before this one runs (a
// copy just stored and read back at other offsets stalls the loads).
QPACK_DWN_TARGET void planes(const DepthwiseNchwF32& a, int64_t p0, int64_t p1) {
  const Padded pad = padded_size(a);
  const size_t floats = (pad.bytes() / sizeof(float) + 15) / 16 * 16;
  auto* buf = static_cast<float*>(own_u8_scratch(0, 2 * floats * sizeof(float)));
  const __m256 lo = _mm256_set1_ps(a.lo), hi = _mm256_set1_ps(a.hi);
  const bool k3 = a.KH == 3 && a.KW == 3;
  float w[kMaxTaps];
  fill_padded(a, a.x + p0 * a.H * a.W, pad, buf);
  int64_t c = p0 % a.C;
  for (int64_t p = p0; p < p1; ++p, c = c + 1 == a.C ? 0 : c + 1) {
    float* P = buf + ((p - p0) & 1) * floats;
    if (p + 1 < p1) fill_padded(a, a.x + (p + 1) * a.H * a.W, pad, buf + ((p + 1 - p0) & 1) * floats);
    const float* wc = channel_weights(a, c);
    for (int64_t kh = 0; kh < a.KH; ++kh) {
      for (int64_t kw = 0; kw < a.KW; ++kw) w[kh * a.KW + kw] = wc[kh * a.wsh + kw * a.wsw];
    }
    const __m256 bias = _mm256_set1_ps(a.bias != nullptr ? a.bias[c] : 0.0f);
    float* y = a.y + p * a.OH * a.OW;
    if (a.SW == 1) {
      k3 ? plane<1, 3>(a, P, pad.cols, w, bias, lo, hi, y) : plane<1, 0>(a, P, pad.cols, w, bias, lo, hi, y);
    } else {
      k3 ? plane<2, 3>(a, P, pad.cols, w, bias, lo, hi, y) : plane<2, 0>(a, P, pad.cols, w, bias, lo, hi, y);
    }
  }
}


// AVX-512: 3x3, stride 1, dense, straight from the input (no padded copy:
// masked loads read zeros outside it). A tile of R rows x V vectors of 16
// outputs (up to 4 x 4: 16 sums, the 9 weights in registers). Each input row
// of the tile's window is loaded once, as the V vectors under the middle tap
// and one either side (the masks are per row, not per load), and the left and
// right taps are those vectors shifted by one lane (valignd): R + 2 rows x
// (V + 2) loads and 2 V shifts for 9 R V FMAs. One masked load per tap (3 x
// as many, each under its own mask register) ran at a third of this speed:
// 144 planes of 56^2, one Zen 5 thread, 180 -> 70 us in a standalone loop,
// the same sums in the same order. The last vector of each row stored under
// a mask (AVX-512's masked moves are no microcode).
#define QPACK_DWN_TARGET512 __attribute__((target("avx512f")))

template <int R, int V>
QPACK_DWN_TARGET512 inline void tile3x3(const DepthwiseNchwF32& a, const float* x, int64_t oh, int64_t ow,
                                        float* y, const __m512* w, __m512 bias, __m512 lo, __m512 hi) {
  __m512 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = bias;
  }
  // Vector k of a row (k = 0..V + 1) holds input columns c0 + 16 (k - 1) +
  // lane, c0 = ow + 1 - PL: the middle tap's of output vector k - 1.
  const int64_t c0 = ow + 1 - a.PL;
  uint32_t inside[V + 2];
#pragma GCC unroll 6
  for (int k = 0; k < V + 2; ++k) {
    const int64_t first = c0 + 16 * (k - 1);
    inside[k] = lanes16(-first, a.W - first);
  }
  const int64_t ih0 = oh - a.PT;
  const uintptr_t base = reinterpret_cast<uintptr_t>(x);
#pragma GCC unroll 6
  for (int i = 0; i < R + 2; ++i) {  // input row i serves output rows i - kh
    const int64_t ih = ih0 + i;
    const uint32_t row = ih >= 0 && ih < a.H ? 0xFFFFu : 0u;  // zeros outside the input
    // (the address computed as an integer: it may point before the input, never read there)
    const auto* in = reinterpret_cast<const float*>(
        base + static_cast<uintptr_t>((std::min<int64_t>(std::max<int64_t>(ih, 0), a.H - 1) * a.W + c0 - 16) *
                                      int64_t(sizeof(float))));
    __m512i xs[V + 2];
#pragma GCC unroll 6
    for (int k = 0; k < V + 2; ++k) {
      xs[k] = _mm512_castps_si512(_mm512_maskz_loadu_ps(_cvtu32_mask16(inside[k] & row), in + 16 * k));
    }
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __m512 taps[3] = {_mm512_castsi512_ps(_mm512_alignr_epi32(xs[v + 1], xs[v], 15)),
                              _mm512_castsi512_ps(xs[v + 1]),
                              _mm512_castsi512_ps(_mm512_alignr_epi32(xs[v + 2], xs[v + 1], 1))};
#pragma GCC unroll 3
      for (int kw = 0; kw < 3; ++kw) {
#pragma GCC unroll 3
        for (int kh = 0; kh < 3; ++kh) {
          const int r = i - kh;
          if (r >= 0 && r < R) acc[r][v] = _mm512_fmadd_ps(taps[kw], w[kh * 3 + kw], acc[r][v]);
        }
      }
    }
  }
  const __mmask16 last = _cvtu32_mask16(lanes16(0, a.OW - ow - 16 * (V - 1)));
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __m512 o = _mm512_min_ps(hi, _mm512_max_ps(lo, acc[r][v]));  // NaN passes
      float* d = y + (oh + r) * a.OW + ow + v * 16;
      if (v == V - 1) {
        _mm512_mask_storeu_ps(d, last, o);
      } else {
        _mm512_storeu_ps(d, o);
      }
    }
  }
}

template <int R>
QPACK_DWN_TARGET512 inline void tile3x3_v(int64_t v, const DepthwiseNchwF32& a, const float* x, int64_t oh,
                                          int64_t ow, float* y, const __m512* w, __m512 bias, __m512 lo,
                                          __m512 hi) {
  switch (v) {
    case 4: tile3x3<R, 4>(a, x, oh, ow, y, w, bias, lo, hi); break;
    case 3: tile3x3<R, 3>(a, x, oh, ow, y, w, bias, lo, hi); break;
    case 2: tile3x3<R, 2>(a, x, oh, ow, y, w, bias, lo, hi); break;
    default: tile3x3<R, 1>(a, x, oh, ow, y, w, bias, lo, hi); break;
  }
}

QPACK_DWN_TARGET512 void planes3x3_512(const DepthwiseNchwF32& a, int64_t p0, int64_t p1) {
  const __m512 lo = _mm512_set1_ps(a.lo), hi = _mm512_set1_ps(a.hi);
  __m512 w[9];
  int64_t c = p0 % a.C;
  for (int64_t p = p0; p < p1; ++p, c = c + 1 == a.C ? 0 : c + 1) {
    const float* wc = channel_weights(a, c);
    for (int64_t kh = 0; kh < 3; ++kh) {
      for (int64_t kw = 0; kw < 3; ++kw) w[kh * 3 + kw] = _mm512_set1_ps(wc[kh * a.wsh + kw * a.wsw]);
    }
    const __m512 bias = _mm512_set1_ps(a.bias != nullptr ? a.bias[c] : 0.0f);
    const float* x = a.x + p * a.H * a.W;
    float* y = a.y + p * a.OH * a.OW;
    for (int64_t oh = 0; oh < a.OH; oh += 4) {
      const int64_t rows = std::min<int64_t>(4, a.OH - oh);
      for (int64_t ow = 0; ow < a.OW; ow += 64) {
        const int64_t v = std::min<int64_t>(4, (a.OW - ow + 15) / 16);
        switch (rows) {
          case 4: tile3x3_v<4>(v, a, x, oh, ow, y, w, bias, lo, hi); break;
          case 3: tile3x3_v<3>(v, a, x, oh, ow, y, w, bias, lo, hi); break;
          case 2: tile3x3_v<2>(v, a, x, oh, ow, y, w, bias, lo, hi); break;
          default: tile3x3_v<1>(v, a, x, oh, ow, y, w, bias, lo, hi); break;
        }
      }
    }
  }
}

// AVX-512 where the CPU has it and oneDNN may use it (ONEDNN_MAX_CPU_ISA=AVX2
// runs the AVX2 path, as on a CPU without it).
bool has_avx512() {
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return cpu && isa_has_avx512_core();
}

}  // namespace

bool depthwise_nchw_f32_fits(int64_t KH, int64_t KW, int64_t SW) {
  return own_avx2_available() && KH * KW <= kMaxTaps && (SW == 1 || SW == 2);
}

namespace {

bool direct_512(const DepthwiseNchwF32& a) {
  return a.KH == 3 && a.KW == 3 && a.SH == 1 && a.SW == 1 && a.DH == 1 && a.DW == 1 && has_avx512();
}

}  // namespace

bool depthwise_nchw_f32_faster(const DepthwiseNchwF32& a) {
  return a.OH * a.OW >= (direct_512(a) ? 28 * 28 : 56 * 56);
}

void depthwise_nchw_f32(const DepthwiseNchwF32& a, int threads) {
  if (a.OH <= 0 || a.OW <= 0) return;
  if (direct_512(a)) {
    parallel_chunks(a.N * a.C, 2, threads, [&](int, int64_t p0, int64_t p1) { planes3x3_512(a, p0, p1); });
    return;
  }
  parallel_chunks(a.N * a.C, 2, threads, [&](int, int64_t p0, int64_t p1) { planes(a, p0, p1); });
}

#else  // not x86-64: oneDNN runs

bool depthwise_nchw_f32_fits(int64_t, int64_t, int64_t) { return false; }
bool depthwise_nchw_f32_faster(const DepthwiseNchwF32&) { return false; }
void depthwise_nchw_f32(const DepthwiseNchwF32&, int) {}

#endif

}  // namespace onednn_rt
}  // namespace qpack
