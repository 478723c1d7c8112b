#include "backends/onednn/pointwise_u8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/parallel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_PW_AVX512 1
#define QPACK_PW_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

namespace qpack {
namespace onednn_rt {
namespace {

// The 64 bytes of outputs 16q .. 16q + 15, inputs 4g .. 4g + 3.
inline int64_t weight_offset(const PointwiseWeights& wl, int64_t q, int64_t g) {
  return 16 * q / wl.block * wl.block_stride + 16 * q % wl.block / 16 * 64 + g * wl.group_stride;
}

}  // namespace

bool pointwise_u8_layout(int64_t OC, int64_t IC, int32_t nblks, const int64_t* blks,
                         const int64_t* idxs, const int64_t* strides, uint64_t size,
                         PointwiseWeights* out) {
  if (IC < 1 || OC < 1 || nblks != 2 || idxs[0] != 0 || idxs[1] != 1 || blks[1] != 4 ||
      !(blks[0] == 16 || blks[0] == 32 || blks[0] == 48 || blks[0] == 64)) {
    return false;
  }
  PointwiseWeights wl{blks[0], strides[0], strides[1], (OC + blks[0] - 1) / blks[0]};
  // every 64 bytes the kernel may read: the last block's outputs padded to the block
  const int64_t last = weight_offset(wl, wl.blocks * wl.block / 16 - 1, (IC + 3) / 4 - 1);
  if (wl.block_stride < 0 || wl.group_stride < 64 || static_cast<uint64_t>(last + 64) > size) {
    return false;
  }
  *out = wl;
  return true;
}

void pointwise_u8_weight_sums(const int8_t* w, const PointwiseWeights& wl, int64_t IC, int64_t OC,
                              int32_t* sums) {
  for (int64_t o = 0; o < OC; ++o) {
    int32_t s = 0;
    for (int64_t g = 0; g < (IC + 3) / 4; ++g) {
      const int8_t* four = w + weight_offset(wl, o / 16, g) + o % 16 * 4;
      s += four[0] + four[1] + four[2] + four[3];
    }
    sums[o] = s;
  }
}

#ifdef QPACK_PW_AVX512
namespace {

// Per-output constants of one run, in groups of 16J outputs (zero past OC).
struct Prepared {
  int32_t* init;   // -src_zero_point * weight sum
  float* mult;     // src_scale * wei_scale[o] / dst_scale
  float* offset;   // bias[o] / dst_scale + dst_zero_point
  bool clamp_lo, clamp_hi;  // the bounds the saturating packs do not give
  uint8_t qmin, qmax;
  int64_t groups;  // of 4 inputs, per window row
  bool sum;        // PointwiseU8::sum
  float residual_mult;
  int64_t rows = 1, row_stride = 0;  // a window's rows (KH) and their distance in x
};

// The constants of outputs [0, padded) in `base` (padded * 12 bytes).
Prepared prepare(const PointwiseU8& a, int64_t padded, uint8_t* base) {
  Prepared p{reinterpret_cast<int32_t*>(base), reinterpret_cast<float*>(base + padded * 4),
             reinterpret_cast<float*>(base + padded * 8), true, true, 0, 255, (a.IC + 3) / 4, a.sum,
             a.residual_mult};
  a.q.bounds(&p.qmin, &p.qmax);
  float largest = 0.0f;  // of |acc * mult + offset|
  for (int64_t o = 0; o < padded; ++o) {
    const bool real = o < a.OC;
    p.init[o] = real ? -a.q.src_zero_point * a.weight_sums[o] : 0;
    p.mult[o] = real ? a.q.mult(o) : 0.0f;
    p.offset[o] = real ? a.q.offset(o) + (a.sum ? a.residual_offset : 0.0f)
                       : static_cast<float>(a.q.dst_zero_point);
    // |acc| <= 255 * 128 * IC: |x - zero point| <= 255, |w| <= 128
    largest = std::max(largest, std::fabs(p.mult[o]) * 255.0f * 128.0f * static_cast<float>(a.IC) +
                                    std::fabs(p.offset[o]));
  }
  // The packs saturate to [0, 255] what converts: values below 2^30 do
  // (std::isfinite also catches inf / NaN scales, which then clamp as before).
  p.clamp_lo = p.qmin > 0;
  p.clamp_hi = p.qmax < 255 || !(std::isfinite(largest) && largest < 1073741824.0f);
  if (a.sum) {  // the add's bounds; the sum's size is not bounded by the above
    p.qmin = a.sum_qmin;
    p.qmax = a.sum_qmax;
    p.clamp_lo = p.clamp_hi = true;
  }
  return p;
}

// R pixels x J groups of 16 outputs from o0, one block of the weights: the
// four input bytes of group g of pixel r are at x[r] + 4g, the weights of
// output group j at w + g * group_stride + 64j. Rows past `rows` repeat a
// valid pixel and are not stored.
template <int J, int R>
QPACK_PW_TARGET void tile(const uint8_t* const* x, int64_t group_stride, const int8_t* w,
                          const Prepared& p, int64_t o0, int64_t OC, __m512 lo, __m512 hi,
                          uint8_t* const* y, int rows) {
  // sum: the tile's residual bytes, read before any of its rows is stored
  // (a row's 64-byte store covers the next pixel's bytes: loads after it
  // would wait for it) and while the multiply-adds run
  // (whole 16- or 8-byte moves where they fit: Zen 5's masked moves are slow)
  __m128i residual[R][J];
  if (p.sum) {
    const int64_t valid = std::min<int64_t>(16 * J, OC - o0);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < J; ++j) {
        const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, valid - 16 * j));
        const uint8_t* in = y[r] + o0 + 16 * j;
        residual[r][j] = n == 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(in))
                         : n == 8 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in))
                                  : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), in);
      }
    }
  }
  __m512i acc[R][J];
  #pragma GCC unroll 24
  for (int j = 0; j < J; ++j) {
    const __m512i init = _mm512_loadu_si512(p.init + o0 + 16 * j);
    #pragma GCC unroll 24
    for (int r = 0; r < R; ++r) acc[r][j] = init;
  }
  const int64_t groups = p.groups;
  for (int64_t kh = 0; kh < p.rows; ++kh) {
    const int64_t at = kh * p.row_stride;
    for (int64_t g = 0; g < groups; ++g, w += group_stride) {
      __m512i wv[J];
      #pragma GCC unroll 24
      for (int j = 0; j < J; ++j) wv[j] = _mm512_loadu_si512(w + 64 * j);
      #pragma GCC unroll 24
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x[r] + at + 4 * g, 4);
        const __m512i xb = _mm512_set1_epi32(four);
        #pragma GCC unroll 24
        for (int j = 0; j < J; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xb, wv[j]);
      }
    }
  }
  // Requantized rows: the saturating packs clamp to [0, 255]; a fused
  // activation's bounds, and values too large to convert, clamp in float.
  __m512 mult[J], offset[J];
  #pragma GCC unroll 24
  for (int j = 0; j < J; ++j) {
    mult[j] = _mm512_loadu_ps(p.mult + o0 + 16 * j);
    offset[j] = _mm512_loadu_ps(p.offset + o0 + 16 * j);
  }
  const int64_t valid = std::min<int64_t>(16 * J, OC - o0);
  #pragma GCC unroll 24
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    __m512i q[4];
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      if (j >= J) {
        q[j] = _mm512_setzero_si512();
        continue;
      }
      __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][j]), mult[j], offset[j]);
      if (p.sum) {  // + the residual's bytes of these 16 outputs
        v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(residual[r][j])),
                            _mm512_set1_ps(p.residual_mult), v);
      }
      if (p.clamp_hi) v = _mm512_min_ps(v, hi);
      if (p.clamp_lo) v = _mm512_max_ps(v, lo);
      q[j] = _mm512_cvtps_epi32(v);  // half to even
    }
    // A row's 16 J bytes in plain 64-, 32- and 16-byte stores, masked only at
    // the outputs' tail (on Zen 5 masked stores streaming to memory take twice
    // the time of plain ones: bench/masked_moves.c).
    if (J == 1) {
      const __m128i b = _mm512_cvtusepi32_epi8(_mm512_max_epi32(q[0], _mm512_setzero_si512()));
      if (valid == 16) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y[r] + o0), b);
      } else {
        _mm_mask_storeu_epi8(y[r] + o0, static_cast<__mmask16>((1u << valid) - 1), b);
      }
      continue;
    }
    // packs / packus interleave 128-bit lanes: dword 4L + j holds outputs
    // 16j + 4L .. 16j + 4L + 3; one permute puts them back in order
    const __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3]));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i row = _mm512_permutexvar_epi32(order, bytes);
    uint8_t* o = y[r] + o0;
    if (valid == 16 * J) {
      if (J == 4) {
        _mm512_storeu_si512(o, row);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_castsi512_si256(row));
        if (J == 3) _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm512_extracti32x4_epi32(row, 2));
      }
      continue;
    }
    _mm512_mask_storeu_epi8(o, (__mmask64(1) << valid) - 1, row);
  }
}

// Output pixels [begin, end) of image-flattened index, every output group of
// the weight w (laid out as wl). Pixel (n, oh, ow) reads x + ((n H + oh SH) W
// + ow SW) C, p.rows rows of 4 p.groups bytes p.row_stride apart: the input
// itself (C = IC, rows 1), or a window's padded image (a.window: C its
// channels, H x W the padded size). With a row that is not a multiple of 4
// bytes the last group reads up to 3 bytes past it, against zero weights; a
// tile that would read past x_end reads its pixels from zero-padded copies
// (a pointwise run's last pixel; the padded image has the bytes).
template <int J, int R>
QPACK_PW_TARGET void run_pixels(const PointwiseU8& a, const Prepared& p, const int8_t* w,
                                const PointwiseWeights& wl, const uint8_t* x0, int64_t H, int64_t W,
                                int64_t C, const uint8_t* x_end, int64_t begin, int64_t end) {
  const __m512 lo = _mm512_set1_ps(p.qmin), hi = _mm512_set1_ps(p.qmax);
  const int64_t padded_ic = 4 * p.groups, reach = (p.rows - 1) * p.row_stride + padded_ic;
  const uint8_t* x[R];
  uint8_t* y[R];
  const bool dense = a.window == nullptr && a.SH == 1 && a.SW == 1;  // output pixel q reads input pixel q
  int64_t n = begin / (a.OH * a.OW), oh = begin / a.OW % a.OH, ow = begin % a.OW;
  for (int64_t p0 = begin; p0 < end; p0 += R) {
    const int rows = static_cast<int>(std::min<int64_t>(R, end - p0));
    for (int r = 0; r < rows; ++r) {
      y[r] = a.y + (p0 + r) * a.OC;
      if (dense) {
        x[r] = x0 + (p0 + r) * C;
        continue;
      }
      x[r] = x0 + ((n * H + oh * a.SH) * W + ow * a.SW) * C;
      if (++ow == a.OW) {
        ow = 0;
        if (++oh == a.OH) {
          oh = 0;
          ++n;
        }
      }
    }
    for (int r = rows; r < R; ++r) {
      x[r] = x[rows - 1];
      y[r] = y[rows - 1];
    }
    if (x[rows - 1] + reach > x_end) {  // the buffer's last pixel, IC % 4 != 0
      auto* copies = static_cast<uint8_t*>(own_u8_scratch(1, static_cast<size_t>(R * padded_ic)));
      for (int r = 0; r < R; ++r) {
        std::memcpy(copies + r * padded_ic, x[r], static_cast<size_t>(a.IC));
        std::memset(copies + r * padded_ic + a.IC, 0, static_cast<size_t>(padded_ic - a.IC));
        x[r] = copies + r * padded_ic;
      }
    }
    for (int64_t b = 0; b < wl.blocks; ++b) {
      tile<J, R>(x, wl.group_stride, w + b * wl.block_stride, p, b * 16 * J, a.OC, lo, hi, y, rows);
    }
  }
}

// Parts of at least about 256K multiply-adds: smaller layers run on the caller.
template <int R, typename Body>
void for_tiles(const PointwiseU8& a, int threads, const Body& body) {
  const int64_t pixels = a.N * a.OH * a.OW;
  const int64_t grain = std::max<int64_t>(2 * R, (int64_t(1) << 18) / std::max<int64_t>(1, a.IC * a.OC));
  const int64_t tiles = (pixels + R - 1) / R;
  parallel_chunks(tiles, (grain + R - 1) / R, threads, [&](int, int64_t b, int64_t e) {
    body(b * R, std::min(pixels, e * R));
  });
}

template <int J, int R>
void run(const PointwiseU8& a, int threads) {
  const int64_t padded = (a.OC + 16 * J - 1) / (16 * J) * 16 * J;
  if (a.window == nullptr) {
    const Prepared p = prepare(a, padded, static_cast<uint8_t*>(own_u8_scratch(0, static_cast<size_t>(padded) * 12)));
    const uint8_t* x_end = a.x + a.N * a.H * a.W * a.IC;
    for_tiles<R>(a, threads, [&](int64_t b, int64_t e) {
      run_pixels<J, R>(a, p, a.w, a.wl, a.x, a.H, a.W, a.IC, x_end, b, e);
    });
    return;
  }
  // The plain weight [OC][KH][KW IC] laid out in one block of 16 J outputs
  // per tile, each window row's KW IC inputs in groups of 4 (zeros past them
  // and past OC), and its sums; the image padded with its zero point. Both
  // beside the constants, on the caller's buffer.
  const WindowU8& win = *a.window;
  const int64_t span = win.KW * win.IC, groups = (span + 3) / 4;
  const PointwiseWeights wl{16 * J, win.KH * groups * 64 * J, 64 * J, padded / (16 * J)};
  const int64_t Hp = std::max(win.pad_t + a.H, (a.OH - 1) * a.SH + win.KH);
  const int64_t Wp = std::max(win.pad_l + a.W, (a.OW - 1) * a.SW + win.KW);
  const int64_t image = Hp * Wp * win.IC, weights = wl.blocks * wl.block_stride;
  auto* base = static_cast<uint8_t*>(
      own_u8_scratch(0, static_cast<size_t>(padded * 16 + weights + a.N * image + 64)));
  auto* sums = reinterpret_cast<int32_t*>(base + padded * 12);
  auto* w = reinterpret_cast<int8_t*>(base + padded * 16);
  uint8_t* xp = base + padded * 16 + weights;
  for (int64_t o = 0; o < padded; ++o) {
    int8_t* dst = w + weight_offset(wl, o / 16, 0) + o % 16 * 4;
    int32_t sum = 0;
    for (int64_t kh = 0; kh < win.KH; ++kh) {
      const int8_t* src = a.w + (o * win.KH + kh) * span;
      for (int64_t g = 0; g < groups; ++g, dst += wl.group_stride) {
        for (int64_t i = 0; i < 4; ++i) {
          const int8_t v = o < a.OC && 4 * g + i < span ? src[4 * g + i] : 0;
          dst[i] = v;
          sum += v;
        }
      }
    }
    sums[o] = sum;
  }
  const auto zp = static_cast<uint8_t>(a.q.src_zero_point);
  std::memset(xp, zp, static_cast<size_t>(a.N * image + 64));
  for (int64_t n = 0; n < a.N; ++n) {
    for (int64_t h = 0; h < a.H; ++h) {
      std::memcpy(xp + n * image + ((win.pad_t + h) * Wp + win.pad_l) * win.IC,
                  a.x + (n * a.H + h) * a.W * win.IC, static_cast<size_t>(a.W * win.IC));
    }
  }
  PointwiseU8 laid = a;
  laid.weight_sums = sums;
  Prepared p = prepare(laid, padded, base);
  p.groups = groups;
  p.rows = win.KH;
  p.row_stride = Wp * win.IC;
  for_tiles<R>(a, threads, [&](int64_t b, int64_t e) {
    run_pixels<J, R>(a, p, w, wl, xp, Hp, Wp, win.IC, xp + a.N * image + 64, b, e);
  });
}

}  // namespace

// Measured against oneDNN's brgemm 1x1 on the same packed weights (one
// thread, bench/bench_own_kernels.py): faster with few inputs per output
// (16->96 @112² 1.55x, 24->144 @56² 1.5x, 64->384 @14² 1.3x) and about even
// up to 576 inputs from 14x14 outputs; slower with blocks of 16 outputs
// (32->16 @112²: 0.9x, one broadcast per multiply-add) and with many inputs
// over few pixels (960->160 @7²: 0.9x, 320->1280 @7²: 0.94x). (Windows over
// 3-channel images, read 4 bytes a tap, measured 0.6-0.9x oneDNN's first-layer
// kernels: not done here.)
bool pointwise_u8_faster(int64_t IC, const PointwiseWeights& wl, int64_t pixels) {
  return wl.block >= 32 && (IC <= 256 || (IC <= 576 && pixels >= 196));
}

// Where a window's rows take fewer groups of 4 inputs than its taps (oneDNN's
// kernels take a group per tap): measured against oneDNN 3.2's kernels on one
// Zen 5 thread (bench/bench_own_kernels.py --kind window), 7x7 3->64 s2 @224²
// 1.17x, 5x5 3->24 1.08x, 3x3 1->32 1.05x, 3x3 2->64 1.32x, 4x4 s4 3->96 1.02x;
// at equal groups (3x3 over RGB, this kernel forced: 0.77-0.90x) oneDNN's
// kernel stays.
bool window_u8_fits(int64_t IC, int64_t KH, int64_t KW) {
  return IC < 4 && KH * KW > 1 && (KW * IC + 3) / 4 < KW;
}

void pointwise_u8(const PointwiseU8& a, int threads) {
  // J = B / 16: a block's outputs in one tile (a window's: by its outputs)
  const int64_t block = a.window == nullptr ? a.wl.block : a.OC <= 16 ? 16 : a.OC <= 32 ? 32 : a.OC <= 48 ? 48 : 64;
  switch (block) {
    case 16: run<1, 16>(a, threads); break;
    case 32: run<2, 12>(a, threads); break;
    case 48: run<3, 8>(a, threads); break;
    default: run<4, 6>(a, threads); break;
  }
}

#else  // not x86-64: oneDNN's own kernel runs

bool pointwise_u8_faster(int64_t, const PointwiseWeights&, int64_t) { return false; }
bool window_u8_fits(int64_t, int64_t, int64_t) { return false; }
void pointwise_u8(const PointwiseU8&, int) {}

#endif

}  // namespace onednn_rt
}  // namespace qpack
