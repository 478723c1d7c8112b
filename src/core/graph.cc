#include "core/graph.h"

#include <algorithm>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#ifdef __SSE2__
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "core/attention.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/quant.h"
#include "core/registry.h"
#include "core/vec_math.h"

namespace qpack {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= d[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i) {
    if (d[i] != o.d[i]) return false;
  }
  return true;
}

namespace {

const char* kind_name(qpack_node_kind k) {
  switch (k) {
    case QPACK_NODE_CONV2D: return "conv2d";
    case QPACK_NODE_LINEAR: return "linear";
    case QPACK_NODE_ADD: return "add";
    case QPACK_NODE_MAXPOOL2D: return "maxpool2d";
    case QPACK_NODE_AVGPOOL2D: return "avgpool2d";
    case QPACK_NODE_GLOBAL_AVGPOOL: return "global_avgpool";
    case QPACK_NODE_FLATTEN: return "flatten";
    case QPACK_NODE_CONCAT: return "concat";
    case QPACK_NODE_ACTIVATION: return "activation";
    case QPACK_NODE_AFFINE: return "affine";
    case QPACK_NODE_QUANTIZE: return "quantize";
    case QPACK_NODE_DEQUANTIZE: return "dequantize";
    case QPACK_NODE_MUL: return "mul";
    case QPACK_NODE_CHANNELS: return "channels";
    case QPACK_NODE_ADAPTIVE_AVGPOOL2D: return "adaptive_avgpool2d";
    case QPACK_NODE_PRELU: return "prelu";
    case QPACK_NODE_RESIZE_NEAREST: return "resize_nearest";
    case QPACK_NODE_RESIZE_BILINEAR: return "resize_bilinear";
    case QPACK_NODE_CHANNEL_RANGE: return "channel_range";
    case QPACK_NODE_LAYER_NORM: return "layer_norm";
    case QPACK_NODE_TRANSPOSE: return "transpose";
    case QPACK_NODE_DEPTH_TO_SPACE: return "depth_to_space";
    case QPACK_NODE_ATTENTION: return "attention";
    case QPACK_NODE_CONSTANT: return "constant";
    case QPACK_NODE_PAD: return "pad";
    case QPACK_NODE_PERMUTE_ROWS: return "permute_rows";
  }
  return "unknown";
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank; ++i) out += (i ? ", " : "") + std::to_string(s.d[i]);
  return out + "]";
}

size_t elem_size(qpack_dtype t) { return t == QPACK_DTYPE_F32 ? 4 : 1; }

// An attention node's distance from one q / k head to the next, and one v head to the next.
int64_t attention_qk_stride(const GraphNode& n) { return n.stride[1] > 0 ? n.stride[1] : n.kernel[1]; }
int64_t attention_v_stride(const GraphNode& n) { return n.pad[3] > 0 ? n.pad[3] : n.stride[0]; }
// pad_right = -1: k and v one head that every q head reads (multi-query attention)
bool attention_multi_query(const GraphNode& n) { return n.pad[3] == -1; }
// act_max: how many window masks follow the heads' [H][L][S] (0: none; checked whole at creation)
int64_t attention_windows(const GraphNode& n) { return static_cast<int64_t>(n.act_max); }

float activate(qpack_activation act, float lo, float hi, float x) {
  switch (act) {
    case QPACK_ACT_NONE: return x;
    case QPACK_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case QPACK_ACT_CLAMP: return std::min(std::max(x, lo), hi);
    case QPACK_ACT_HARDSWISH: return x * std::min(std::max(x + 3.0f, 0.0f), 6.0f) / 6.0f;
    case QPACK_ACT_SIGMOID: return 1.0f / (1.0f + std::exp(-x));
    case QPACK_ACT_GELU: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case QPACK_ACT_SILU: return x / (1.0f + std::exp(-x));
    case QPACK_ACT_HARDSIGMOID: return std::min(std::max(x + 3.0f, 0.0f), 6.0f) / 6.0f;
    case QPACK_ACT_LEAKY_RELU: return x > 0.0f ? x : x * lo;
    case QPACK_ACT_TANH: return std::tanh(x);
  }
  return x;
}

// activate() over a range, the activation chosen once so that the clamp-like
// ones vectorize (same values as activate()).
void activate_range(qpack_activation act, float lo, float hi, const float* x, int64_t n, float* y) {
  switch (act) {
    case QPACK_ACT_CLAMP:
      for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(x[i], lo), hi);
      return;
    case QPACK_ACT_HARDSWISH:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * std::min(std::max(x[i] + 3.0f, 0.0f), 6.0f) / 6.0f;
      return;
    case QPACK_ACT_HARDSIGMOID:
      for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(x[i] + 3.0f, 0.0f), 6.0f) / 6.0f;
      return;
    case QPACK_ACT_LEAKY_RELU:
      // a select of two values (vectorizes: graph.cc is built with -fno-trapping-math)
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i], m = v * lo;
        y[i] = v > 0.0f ? v : m;
      }
      return;
    default:
      for (int64_t i = 0; i < n; ++i) y[i] = activate(act, lo, hi, x[i]);
  }
}

// LayerNorm of `rows` contiguous rows of C values (x and y may be the same
// array): mean, then the biased variance of x - mean (two passes, as
// PyTorch's CPU kernel), (x - mean) / sqrt(var + eps) * w[c] + b[c]. The
// vector code (vec_math.h) where the CPU has it, else this loop.
void layer_norm_rows(const float* x, int64_t rows, int64_t C, const float* w, const float* b, float eps,
                     float* y) {
  if (layer_norm_f32_vector(x, rows, C, w, b, eps, y)) return;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    float sum = 0.0f;
    for (int64_t c = 0; c < C; ++c) sum += xr[c];
    const float mean = sum / static_cast<float>(C);
    float ss = 0.0f;
    for (int64_t c = 0; c < C; ++c) ss += (xr[c] - mean) * (xr[c] - mean);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mean) * inv * w[c] + b[c];
  }
}

// LayerNorm down the columns of a [len][cols] block (each column normalized
// over its len values, weight and bias by row): the steps of
// layer_norm_rows with the columns as vector lanes (loops over contiguous
// columns). mean and inv: cols floats of scratch.
void layer_norm_columns(const float* x, int64_t len, int64_t cols, const float* w, const float* b, float eps,
                        float* mean, float* inv, float* y) {
  for (int64_t c = 0; c < cols; ++c) mean[c] = inv[c] = 0.0f;
  for (int64_t r = 0; r < len; ++r) {
    for (int64_t c = 0; c < cols; ++c) mean[c] += x[r * cols + c];
  }
  const float inv_len = 1.0f / static_cast<float>(len);
  for (int64_t c = 0; c < cols; ++c) mean[c] = mean[c] * inv_len;
  for (int64_t r = 0; r < len; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float d = x[r * cols + c] - mean[c];
      inv[c] += d * d;
    }
  }
  for (int64_t c = 0; c < cols; ++c) inv[c] = 1.0f / std::sqrt(inv[c] * inv_len + eps);
  for (int64_t r = 0; r < len; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (x[r * cols + c] - mean[c]) * inv[c] * w[r] + b[r];
  }
}

// y = act(x) over n floats (x and y may be the same array): ReLU's max, the
// vector code (vec_math.h) where it has act, else activate_range.
void activate_f32(qpack_activation act, float lo, float hi, const float* x, int64_t n, float* y) {
  if (act == QPACK_ACT_RELU) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::max(x[i], 0.0f);
  } else if (!activate_f32_vector(act, x, y, n)) {
    activate_range(act, lo, hi, x, n, y);
  }
}

// Storage of a value as outer x channels x inner (channels: logical dim 1):
// NHWC rank-4 is (N*H*W, C, 1); rank 2 is (N, C, 1); rank 3 (N, C, L).
void split_channels(const Shape& s, int64_t* outer, int64_t* channels, int64_t* inner) {
  if (s.rank == 4) {
    *outer = s.d[0] * s.d[2] * s.d[3];
    *channels = s.d[1];
    *inner = 1;
    return;
  }
  *outer = s.d[0];
  *channels = s.rank >= 2 ? s.d[1] : 1;
  *inner = s.rank == 3 ? s.d[2] : 1;
}

// PyTorch's pooled size (floor or ceil; with ceil the last window must start
// inside the input or its left padding).
int64_t pooled(int64_t in, int64_t k, int64_t s, int64_t pad_lo, int64_t pad_hi, bool ceil_mode) {
  const int64_t span = in + pad_lo + pad_hi - k;
  check(span >= 0, QPACK_STATUS_INVALID_ARGUMENT, "pooling window ", k,
        " is larger than the padded input ", in + pad_lo + pad_hi);
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + pad_lo) --out;
  return out;
}

constexpr int64_t kGrain = int64_t(1) << 14;

// body(begin, end) over [0, n), split over qpack's threads when n is large.
template <typename Body>
void parallel_range(int64_t n, int64_t grain, const Body& body) {
  parallel_chunks(n, grain, num_threads(), [&](int, int64_t b, int64_t e) {
    if (e > b) body(b, e);
  });
}

struct Q {
  float scale;
  int32_t zp;
  float deq(uint8_t v) const { return (static_cast<int32_t>(v) - zp) * scale; }
  uint8_t quant(float v) const { return quantize_u8(v, scale, zp); }
};

// round-half-even(v) + zp clamped to [0, 255], by the 1.5 * 2^23 trick (which
// vectorizes where nearbyint does not); |v| is clamped first so the trick holds.
inline uint8_t round_u8(float v, float zp) {
  v = std::min(std::max(v, -512.0f), 512.0f);
  v = (v + 12582912.0f) - 12582912.0f + zp;
  return static_cast<uint8_t>(std::min(std::max(v, 0.0f), 255.0f));
}

// y[i] = round_u8(v[i], zp): the vector quantizer (AVX-512F / AVX2, the same
// values) for the prefix it does, then the scalar rounding; byte loops of
// round_u8 stay scalar in GCC's hands (~5 ns per value).
void store_u8(const float* v, int64_t n, float zp, uint8_t* y) {
  for (int64_t i = quantize_u8_vector(v, n, 1.0f, zp, y); i < n; ++i) y[i] = round_u8(v[i], zp);
}

// y[i] = q.deq(x[i]): the vector dequantizer for the prefix it does, then the
// scalar one (the same values); store_u8's counterpart.
void load_f32(const uint8_t* x, int64_t n, const Q& q, float* y) {
  for (int64_t i = dequantize_u8_vector(x, n, q.scale, q.zp, y); i < n; ++i) y[i] = q.deq(x[i]);
}

// load_f32 of n values over qpack's threads: a dequantize node's, an attention node's inputs.
void load_f32_parallel(const uint8_t* x, int64_t n, const Q& q, float* y) {
  parallel_range(n, kGrain, [&](int64_t b, int64_t e) { load_f32(x + b, e - b, q, y + b); });
}

// y = round_u8((x - zx) m[c] + b[c], zy) over outer x channels x inner values
// (channel c's m[c] and b[c] for each run of inner values; b NULL: no shift):
// the u8 affine node and the per-channel u8 mul. AVX-512 (vec_math.cc) or
// this loop, the same float operations, so the same values.
void affine_u8(const uint8_t* x, int64_t outer, int64_t channels, int64_t inner, const float* m, const float* b,
               float zx, float zy, uint8_t* y) {
  if (affine_u8_vector(x, outer, channels, inner, m, b, zx, zy, y)) return;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      const float mc = m[c], bc = b != nullptr ? b[c] : 0.0f;  // + 0: the same value
      const int64_t base = (o * channels + c) * inner;
      for (int64_t k = base; k < base + inner; ++k) y[k] = round_u8((static_cast<float>(x[k]) - zx) * mc + bc, zy);
    }
  }
}

uint8_t* thread_workspace(size_t size) {
  struct Deleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  // 64 readable bytes before and after: QNNPACK's kernels read up to 7 bytes
  // before a row and past its end (alignment stays 64).
  constexpr size_t kGuard = 64;
  thread_local std::unique_ptr<uint8_t, Deleter> buffer;
  thread_local size_t capacity = 0;
  if (capacity < size) {
    void* p = nullptr;
    check(posix_memalign(&p, 64, size + 2 * kGuard) == 0 && p != nullptr,
          QPACK_STATUS_OUT_OF_MEMORY, "could not allocate a ", size, "-byte graph workspace");
    buffer.reset(static_cast<uint8_t*>(p));
    capacity = size;
  }
  return buffer.get() + kGuard;
}

// Element by element, the rectangle [r0, r1) x [c0, c1) of src [rows][cols]
// into dst [cols][rows]: the transposes' edges and narrow tiles.
template <typename T>
void transpose_elements(const T* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                        int64_t c1, T* d) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) d[c * rows + r] = s[r * cols + c];
  }
}

// Rows [r0, r1) of src [rows][cols] into dst [cols][rows]: AVX2 blocks of
// 8x8 floats (vec_math.h) where the CPU has AVX2, else SSE2 blocks of 4x4
// floats; SSE2 blocks of 16x16 bytes (baseline x86-64); elements elsewhere.
// (3136 x 144: f32 274 -> 81 us (SSE2) -> 55 us (AVX2, Zen 4), u8 148 -> 84 us,
// one thread.)
void transpose_rows(const float* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* d) {
  const int64_t c8 = transpose_f32_vector(s, rows, cols, r0, r1, d);  // AVX2 8 x 8 blocks
  if (c8 > 0) {
    const int64_t r8 = r0 + (r1 - r0) / 8 * 8;
    transpose_elements(s, rows, cols, r0, r8, c8, cols, d);
    transpose_elements(s, rows, cols, r8, r1, 0, cols, d);
    return;
  }
  int64_t r = r0;
#ifdef __SSE2__
  for (; r + 4 <= r1; r += 4) {
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      __m128 a = _mm_loadu_ps(s + r * cols + c), b = _mm_loadu_ps(s + (r + 1) * cols + c);
      __m128 e = _mm_loadu_ps(s + (r + 2) * cols + c), f = _mm_loadu_ps(s + (r + 3) * cols + c);
      _MM_TRANSPOSE4_PS(a, b, e, f);
      _mm_storeu_ps(d + c * rows + r, a);
      _mm_storeu_ps(d + (c + 1) * rows + r, b);
      _mm_storeu_ps(d + (c + 2) * rows + r, e);
      _mm_storeu_ps(d + (c + 3) * rows + r, f);
    }
    transpose_elements(s, rows, cols, r, r + 4, c, cols, d);
  }
#endif
  transpose_elements(s, rows, cols, r, r1, 0, cols, d);
}

void transpose_rows(const uint8_t* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1, uint8_t* d) {
  int64_t r = r0;
#ifdef __SSE2__
  for (; r + 16 <= r1; r += 16) {
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      // interleaving each row with the one 8 below it, four times, transposes 16x16
      __m128i v[16], w[16];
      for (int i = 0; i < 16; ++i) {
        v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + (r + i) * cols + c));
      }
      for (int round = 0; round < 4; ++round) {
        for (int i = 0; i < 8; ++i) {
          w[2 * i] = _mm_unpacklo_epi8(v[i], v[i + 8]);
          w[2 * i + 1] = _mm_unpackhi_epi8(v[i], v[i + 8]);
        }
        for (int i = 0; i < 16; ++i) v[i] = w[i];
      }
      for (int i = 0; i < 16; ++i) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (c + i) * rows + r), v[i]);
      }
    }
    transpose_elements(s, rows, cols, r, r + 16, c, cols, d);
  }
#endif
  transpose_elements(s, rows, cols, r, r1, 0, cols, d);
}

// d[2k] = a[k], d[2k + 1] = b[k] for k < n (a channel shuffle in 2 groups of
// one NHWC pixel): SSE2 unpacks (baseline x86-64), elements elsewhere.
// (ShuffleNetV2's u8 shuffles, 116 x 28²: 172 -> 7 us per node, one thread.)
void interleave2(const uint8_t* a, const uint8_t* b, int64_t n, uint8_t* d) {
  int64_t k = 0;
#ifdef __SSE2__
  for (; k + 16 <= n; k += 16) {
    const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k));
    const __m128i vb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * k), _mm_unpacklo_epi8(va, vb));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * k + 16), _mm_unpackhi_epi8(va, vb));
  }
#endif
  for (; k < n; ++k) {
    d[2 * k] = a[k];
    d[2 * k + 1] = b[k];
  }
}

void interleave2(const float* a, const float* b, int64_t n, float* d) {
  int64_t k = 0;
#ifdef __SSE2__
  for (; k + 4 <= n; k += 4) {
    const __m128 va = _mm_loadu_ps(a + k), vb = _mm_loadu_ps(b + k);
    _mm_storeu_ps(d + 2 * k, _mm_unpacklo_ps(va, vb));
    _mm_storeu_ps(d + 2 * k + 4, _mm_unpackhi_ps(va, vb));
  }
#endif
  for (; k < n; ++k) {
    d[2 * k] = a[k];
    d[2 * k + 1] = b[k];
  }
}

// [N, rows, cols] -> [N, cols, rows] ([N, C, HW] <-> [N, HW, C]): blocks of
// rows in parallel. Narrow matrices (fewer than 16 columns or rows: an
// image's 3 channels) go by 32 x 32 tiles of elements, faster there than the
// vector blocks' edges.
template <typename T>
void transpose_tiles(const T* __restrict src, int64_t N, int64_t rows, int64_t cols, T* __restrict dst) {
  constexpr int64_t kTile = 32;
  const bool vector = rows >= 16 && cols >= 16;
  for (int64_t n = 0; n < N; ++n) {
    const T* s = src + n * rows * cols;
    T* d = dst + n * rows * cols;
    parallel_range((rows + kTile - 1) / kTile, 8, [&](int64_t b, int64_t e) {
      const int64_t end = std::min(rows, e * kTile);
      if (vector) {
        transpose_rows(s, rows, cols, b * kTile, end, d);
        return;
      }
      for (int64_t r0 = b * kTile; r0 < end; r0 += kTile) {
        for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
          transpose_elements(s, rows, cols, r0, std::min(end, r0 + kTile), c0, std::min(cols, c0 + kTile), d);
        }
      }
    });
  }
}

void transpose_channels(const uint8_t* src, int64_t N, int64_t rows, int64_t cols, size_t es,
                        uint8_t* dst) {
  if (es == 4) {
    transpose_tiles(reinterpret_cast<const float*>(src), N, rows, cols, reinterpret_cast<float*>(dst));
  } else {
    transpose_tiles(src, N, rows, cols, dst);
  }
}

// n bytes from s to d; with `stream` (an output larger than the caches) by
// non-temporal stores where d is 16-byte aligned, which skip reading the
// destination's lines first (as glibc's memcpy does for large copies; a
// concat's per-pixel runs are too short for it to): UNet-like concats of
// [1, 96, 256, 256] / [1, 192, 128, 128] f32, one Zen 5 thread, 1360 -> 1090
// and 726 -> 518 us (ORT 1085 / 480).
inline void copy_run(uint8_t* __restrict d, const uint8_t* __restrict s, size_t n, bool stream) {
  size_t i = 0;
#ifdef __SSE2__
  if (stream && reinterpret_cast<uintptr_t>(d) % 16 == 0) {
    for (; i + 16 <= n; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    }
  }
#endif
  if (i < n) std::memcpy(d + i, s + i, n - i);
}

// A pooling window of output (oh, ow): [hs, he) x [ws, we) inside the input,
// and the padded window's size for count_include_pad.
struct Window {
  int64_t hs, he, ws, we, padded;
};
Window window(const GraphNode& n, int64_t H, int64_t W, int64_t oh, int64_t ow) {
  const int64_t h0 = oh * n.stride[0] - n.pad[0], w0 = ow * n.stride[1] - n.pad[1];
  const int64_t h1 = std::min(h0 + n.kernel[0], H + n.pad[2]);
  const int64_t w1 = std::min(w0 + n.kernel[1], W + n.pad[3]);
  return Window{std::max<int64_t>(h0, 0), std::min(h1, H), std::max<int64_t>(w0, 0), std::min(w1, W),
                (h1 - h0) * (w1 - w0)};
}

// o[c] = the max over `count` rows of their value c (rows[k][c] > m ? rows[k][c] : m,
// in row order, for floats too: a NaN in a later row does not win, as before).
template <typename T>
inline void max_rows_scalar(const T* const* rows, int64_t count, int64_t begin, int64_t C,
                            T* __restrict o) {
  for (int64_t c = begin; c < C; ++c) {
    T m = rows[0][c];
    for (int64_t k = 1; k < count; ++k) m = rows[k][c] > m ? rows[k][c] : m;
    o[c] = m;
  }
}

// SSE2 (baseline x86-64): 64 bytes / 16 floats of the output in four
// registers while the rows stream by (ResNet-18's u8 3x3 / 2 max pooling of
// [1, 64, 112, 112] in its graph: 197 -> 105 us on one thread; the compiler's
// loops kept the block in memory).
#ifdef __SSE2__
inline void max_rows(const uint8_t* const* rows, int64_t count, int64_t C, uint8_t* __restrict o) {
  auto load = [](const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  int64_t c0 = 0;
  for (; c0 + 64 <= C; c0 += 64) {
    __m128i a0 = load(rows[0] + c0), a1 = load(rows[0] + c0 + 16), a2 = load(rows[0] + c0 + 32),
            a3 = load(rows[0] + c0 + 48);
    for (int64_t k = 1; k < count; ++k) {
      const uint8_t* p = rows[k] + c0;
      a0 = _mm_max_epu8(a0, load(p));
      a1 = _mm_max_epu8(a1, load(p + 16));
      a2 = _mm_max_epu8(a2, load(p + 32));
      a3 = _mm_max_epu8(a3, load(p + 48));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + c0), a0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + c0 + 16), a1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + c0 + 32), a2);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + c0 + 48), a3);
  }
  for (; c0 < C && C >= 16; c0 += 16) {
    c0 = std::min(c0, C - 16);  // the last block overlaps the one before (a max again: the same bytes)
    __m128i a = load(rows[0] + c0);
    for (int64_t k = 1; k < count; ++k) a = _mm_max_epu8(a, load(rows[k] + c0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + c0), a);
  }
  max_rows_scalar(rows, count, c0, C, o);
}

inline void max_rows(const float* const* rows, int64_t count, int64_t C, float* __restrict o) {
  int64_t c0 = 0;
  for (; c0 + 16 <= C; c0 += 16) {
    __m128 a0 = _mm_loadu_ps(rows[0] + c0), a1 = _mm_loadu_ps(rows[0] + c0 + 4),
           a2 = _mm_loadu_ps(rows[0] + c0 + 8), a3 = _mm_loadu_ps(rows[0] + c0 + 12);
    for (int64_t k = 1; k < count; ++k) {
      const float* p = rows[k] + c0;
      // maxps(p, a) = p > a ? p : a, the scalar loop's choice
      a0 = _mm_max_ps(_mm_loadu_ps(p), a0);
      a1 = _mm_max_ps(_mm_loadu_ps(p + 4), a1);
      a2 = _mm_max_ps(_mm_loadu_ps(p + 8), a2);
      a3 = _mm_max_ps(_mm_loadu_ps(p + 12), a3);
    }
    _mm_storeu_ps(o + c0, a0);
    _mm_storeu_ps(o + c0 + 4, a1);
    _mm_storeu_ps(o + c0 + 8, a2);
    _mm_storeu_ps(o + c0 + 12, a3);
  }
  for (; c0 < C && C >= 4; c0 += 4) {
    c0 = std::min(c0, C - 4);  // the last block overlaps the one before (the same values again)
    __m128 a = _mm_loadu_ps(rows[0] + c0);
    for (int64_t k = 1; k < count; ++k) a = _mm_max_ps(_mm_loadu_ps(rows[k] + c0), a);
    _mm_storeu_ps(o + c0, a);
  }
  max_rows_scalar(rows, count, c0, C, o);
}
#else
template <typename T>
inline void max_rows(const T* const* rows, int64_t count, int64_t C, T* __restrict o) {
  max_rows_scalar(rows, count, 0, C, o);
}
#endif

template <typename T>
inline void sum_into(float* __restrict acc, const T* __restrict p, int64_t C) {
  for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<float>(p[c]);
}

// NHWC max pooling; u8 keeps its parameters, so the max of the bytes is exact.
template <typename T>
void max_pool(const T* __restrict x, const Shape& xs, const Shape& ys, const GraphNode& n,
              T* __restrict y) {
  const int64_t H = xs.d[2], W = xs.d[3], C = xs.d[1], OH = ys.d[2], OW = ys.d[3];
  const T lowest = std::numeric_limits<T>::lowest() < 0 ? -std::numeric_limits<T>::infinity()
                                                        : std::numeric_limits<T>::lowest();
  parallel_range(ys.d[0] * OH, 1, [&](int64_t b, int64_t e) {
    std::vector<const T*> rows(static_cast<size_t>(n.kernel[0] * n.kernel[1]));
    for (int64_t r = b; r < e; ++r) {
      const int64_t img = r / OH, oh = r % OH;
      // Stride 1 along W: the windows of columns [lo, hi) lie inside the input's row, and
      // their maxima over the output row are max_rows over the window's taps, each tap the
      // input row shifted by whole pixels, (hi - lo) C values long, in the taps' order
      // (HGNetV2's 2 x 2 / 1 pool of [1, 16, 113, 113], fp32, one Zen 5 thread: a window at a
      // time took 119 us)
      int64_t lo = 0, hi = 0;
      if (n.stride[1] == 1) {
        const Window taps = window(n, H, W, oh, 0);
        lo = std::min<int64_t>(n.pad[1], OW);
        hi = std::max(lo, std::min<int64_t>(OW, W - n.kernel[1] + n.pad[1] + 1));
        if (taps.he <= taps.hs) lo = hi = 0;
        int64_t count = 0;
        for (int64_t h = taps.hs; h < taps.he && hi > lo; ++h) {
          for (int64_t k = 0; k < n.kernel[1]; ++k) rows[count++] = x + ((img * H + h) * W + lo - n.pad[1] + k) * C;
        }
        if (count > 0) max_rows(rows.data(), count, (hi - lo) * C, y + ((img * OH + oh) * OW + lo) * C);
      }
      for (int64_t ow = 0; ow < OW; ++ow) {
        if (ow >= lo && ow < hi) continue;
        const Window win = window(n, H, W, oh, ow);
        T* __restrict o = y + ((img * OH + oh) * OW + ow) * C;
        // With AVX-512 the window's pixels straight from x, a vector of channels
        // at a time (ResNet-18's u8 3x3 / 2 pooling of [1, 64, 112, 112] in its
        // graph, one Zen 5 thread: 51 -> 29 us; f32 pooling there is bound by memory, 116-125 -> 107-120 us)
        if (win.he > win.hs && win.we > win.ws &&
            max_window_vector(x + ((img * H + win.hs) * W + win.ws) * C, W * C, C, win.he - win.hs,
                              win.we - win.ws, o)) {
          continue;
        }
        int64_t count = 0;
        for (int64_t h = win.hs; h < win.he; ++h) {
          for (int64_t w = win.ws; w < win.we; ++w) rows[count++] = x + ((img * H + h) * W + w) * C;
        }
        if (count == 0) {
          std::fill(o, o + C, lowest);
        } else {
          max_rows(rows.data(), count, C, o);
        }
      }
    }
  });
}

// NHWC average pooling in float on (x - zp) * scale; out(v) stores each mean.
template <typename T, typename Out, typename Store>
void avg_pool(const T* __restrict x, Q q, const Shape& xs, const Shape& ys, const GraphNode& n,
              const Store& out, Out* __restrict y) {
  const int64_t H = xs.d[2], W = xs.d[3], C = xs.d[1], OH = ys.d[2], OW = ys.d[3];
  parallel_range(ys.d[0] * OH, 1, [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(C));
    for (int64_t r = b; r < e; ++r) {
      const int64_t img = r / OH, oh = r % OH;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Window win = window(n, H, W, oh, ow);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t h = win.hs; h < win.he; ++h) {
          for (int64_t w = win.ws; w < win.we; ++w) sum_into(acc.data(), x + ((img * H + h) * W + w) * C, C);
        }
        const int64_t inside = (win.he - win.hs) * (win.we - win.ws);
        const int64_t divisor = n.count_include_pad ? win.padded : inside;
        const float inv = q.scale / static_cast<float>(std::max<int64_t>(divisor, 1));
        const float zp_sum = static_cast<float>(q.zp) * static_cast<float>(inside);
        Out* __restrict o = y + ((img * OH + oh) * OW + ow) * C;
        for (int64_t c = 0; c < C; ++c) o[c] = out((acc[c] - zp_sum) * inv);
      }
    }
  });
}

// NHWC adaptive average pooling: output (oh, ow) averages rows [floor(oh H / OH),
// ceil((oh + 1) H / OH)) and likewise columns, as PyTorch; in float on (x - zp) * scale.
template <typename T, typename Out, typename Store>
void adaptive_avg_pool(const T* __restrict x, Q q, const Shape& xs, const Shape& ys, const Store& out,
                       Out* __restrict y) {
  const int64_t H = xs.d[2], W = xs.d[3], C = xs.d[1], OH = ys.d[2], OW = ys.d[3];
  parallel_range(ys.d[0] * OH, 1, [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(C));
    for (int64_t r = b; r < e; ++r) {
      const int64_t img = r / OH, oh = r % OH;
      const int64_t hs = oh * H / OH, he = ((oh + 1) * H + OH - 1) / OH;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t ws = ow * W / OW, we = ((ow + 1) * W + OW - 1) / OW;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t h = hs; h < he; ++h) {
          for (int64_t w = ws; w < we; ++w) sum_into(acc.data(), x + ((img * H + h) * W + w) * C, C);
        }
        const int64_t inside = (he - hs) * (we - ws);
        const float inv = q.scale / static_cast<float>(std::max<int64_t>(inside, 1));
        const float zp_sum = static_cast<float>(q.zp) * static_cast<float>(inside);
        Out* __restrict o = y + ((img * OH + oh) * OW + ow) * C;
        for (int64_t c = 0; c < C; ++c) o[c] = out((acc[c] - zp_sum) * inv);
      }
    }
  });
}

// PyTorch's source coordinates of a resize along one axis (upsample_*2d's CPU
// kernels, in float as they compute): nearest, floor(dst * scale) clamped;
// bilinear, the two taps and their weights. `scale_factor` > 0 is the
// caller's (coordinates by 1 / scale_factor), 0: by in / out.
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<float> w0, w1;
};
Taps resize_taps(bool bilinear, bool align_corners, int64_t in, int64_t out, float scale_factor) {
  Taps t;
  t.i0.resize(static_cast<size_t>(out));
  t.i1.resize(t.i0.size());
  t.w0.assign(t.i0.size(), 1.0f);
  t.w1.assign(t.i0.size(), 0.0f);
  const float scale = align_corners ? (out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f)
                      : scale_factor > 0 ? static_cast<float>(1.0 / static_cast<double>(scale_factor))
                                         : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    const size_t k = static_cast<size_t>(d);
    if (!bilinear) {
      t.i0[k] = out == in ? d : out == 2 * in ? d >> 1
                : std::min(static_cast<int64_t>(std::floor(static_cast<float>(d) * scale)), in - 1);
      t.i1[k] = t.i0[k];
      continue;
    }
    if (out == in) {
      t.i0[k] = t.i1[k] = d;
      continue;
    }
    const float real = align_corners ? scale * static_cast<float>(d)
                                     : std::max(scale * (static_cast<float>(d) + 0.5f) - 0.5f, 0.0f);
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(real)), in - 1);
    const float l1 = std::min(std::max(real - static_cast<float>(i0), 0.0f), 1.0f);
    t.i0[k] = i0;
    t.i1[k] = i0 + (i0 < in - 1 ? 1 : 0);
    t.w0[k] = 1.0f - l1;
    t.w1[k] = l1;
  }
  return t;
}

// NHWC nearest resize: each output pixel copies its source pixel's C values (u8
// keeps its parameters); an output row with the same source row as the one
// before it is a copy of that row.
template <typename T>
void resize_nearest(const T* __restrict x, const Shape& xs, const Shape& ys, const Taps& th, const Taps& tw,
                    T* __restrict y) {
  const int64_t H = xs.d[2], W = xs.d[3], C = xs.d[1], OH = ys.d[2], OW = ys.d[3];
  parallel_range(ys.d[0] * OH, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t img = r / OH, oh = r % OH;
      T* __restrict o = y + r * OW * C;
      if (oh > 0 && r > b && th.i0[oh] == th.i0[oh - 1]) {
        std::memcpy(o, o - OW * C, static_cast<size_t>(OW * C) * sizeof(T));
        continue;
      }
      const T* row = x + (img * H + th.i0[oh]) * W * C;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const T* __restrict p = row + tw.i0[ow] * C;
        for (int64_t c = 0; c < C; ++c) o[ow * C + c] = p[c];
      }
    }
  });
}

// NHWC bilinear resize in float on (x - zp) * scale, PyTorch's weights
// (h0 (w0 x00 + w1 x01) + h1 (w0 x10 + w1 x11)): each source row interpolated
// along W once into a float row (kept while output rows read it), then each
// output row as one long loop over OW * C (vectorizes for any C); out(v)
// stores each row: out(h0, a, h1, b, n, y) for y[k] = h0 a[k] + h1 b[k].
template <typename T, typename Out, typename Store>
void resize_bilinear(const T* __restrict x, Q q, const Shape& xs, const Shape& ys, const Taps& th, const Taps& tw,
                     const Store& out, Out* __restrict y) {
  const int64_t H = xs.d[2], W = xs.d[3], C = xs.d[1], OH = ys.d[2], OW = ys.d[3];
  const float zp = static_cast<float>(q.zp), s = q.scale;
  parallel_range(ys.d[0] * OH, 1, [&](int64_t b, int64_t e) {
    std::vector<float> buffer(static_cast<size_t>(2 * OW * C));
    float* rows[2] = {buffer.data(), buffer.data() + OW * C};
    int64_t held[2] = {-1, -1};  // the source row (img * H + h) each buffer holds
    auto along_w = [&](int64_t src, float* __restrict d) {
      const T* row = x + src * W * C;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const T* __restrict p0 = row + tw.i0[ow] * C;
        const T* __restrict p1 = row + tw.i1[ow] * C;
        const float w0 = tw.w0[ow], w1 = tw.w1[ow];
        float* __restrict o = d + ow * C;
        for (int64_t c = 0; c < C; ++c) {
          o[c] = w0 * (static_cast<float>(p0[c]) - zp) + w1 * (static_cast<float>(p1[c]) - zp);
        }
      }
    };
    for (int64_t r = b; r < e; ++r) {
      const int64_t img = r / OH, oh = r % OH;
      const int64_t top = img * H + th.i0[oh], bottom = img * H + th.i1[oh];
      if (held[0] != top) {
        if (held[1] == top) {
          std::swap(rows[0], rows[1]);
          std::swap(held[0], held[1]);
        } else {
          along_w(top, rows[0]);
          held[0] = top;
        }
      }
      if (held[1] != bottom) {
        along_w(bottom, rows[1]);
        held[1] = bottom;
      }
      const float h0 = th.w0[oh] * s, h1 = th.w1[oh] * s;
      const float* __restrict a = rows[0];
      const float* __restrict c = rows[1];
      Out* __restrict o = y + r * OW * C;
      out(h0, a, h1, c, OW * C, o);
    }
  });
}

}  // namespace

// ---- construction: types and wiring ----------------------------------------------

Graph::Graph(std::vector<GraphValue> values, std::vector<GraphNode> nodes, std::vector<int> inputs,
             std::vector<int> outputs)
    : values_(std::move(values)), nodes_(std::move(nodes)), inputs_(std::move(inputs)),
      outputs_(std::move(outputs)) {
  const int nv = static_cast<int>(values_.size());
  check(nv >= 1 && !inputs_.empty() && !outputs_.empty(), QPACK_STATUS_INVALID_ARGUMENT,
        "a graph needs at least one value, one input and one output");
  for (int v = 0; v < nv; ++v) {
    const GraphValue& val = values_[v];
    check(val.dtype == QPACK_DTYPE_F32 || val.dtype == QPACK_DTYPE_U8, QPACK_STATUS_INVALID_ARGUMENT,
          "value ", v, " has an unknown dtype ", static_cast<int>(val.dtype));
    if (val.dtype == QPACK_DTYPE_U8) {
      check_scale(val.scale, "value scale", v);
      check_u8_zero_point(val.zero_point, "value zero_point");
    }
  }
  std::vector<int> ready(nv, 0);  // 1: produced (or fed) so far
  auto check_value = [&](int v, const char* what) {
    check(v >= 0 && v < nv, QPACK_STATUS_INVALID_ARGUMENT, what, " value ", v,
          " is outside [0, ", nv, ")");
  };
  for (int v : inputs_) {
    check_value(v, "input");
    check(!ready[v], QPACK_STATUS_INVALID_ARGUMENT, "value ", v, " is fed twice");
    ready[v] = 1;
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    GraphNode& n = nodes_[i];
    check(n.kind >= QPACK_NODE_CONV2D && n.kind <= kLastNodeKind,
          QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " has an unknown kind ", static_cast<int>(n.kind));
    const char* kind = kind_name(n.kind);
    const bool resize = n.kind == QPACK_NODE_RESIZE_NEAREST || n.kind == QPACK_NODE_RESIZE_BILINEAR;
    const size_t want = (n.kind == QPACK_NODE_ADD || n.kind == QPACK_NODE_MUL) ? 2
                        : n.kind == QPACK_NODE_ATTENTION                    ? 3
                        : n.kind == QPACK_NODE_TRANSPOSE                    ? std::min<size_t>(n.in.size(), 2)
                        : n.kind == QPACK_NODE_CONCAT                       ? n.in.size()
                        : resize                                            ? std::min<size_t>(n.in.size(), 2)
                                                                            : 1;
    const bool one_or_two = resize || n.kind == QPACK_NODE_TRANSPOSE;
    check(!n.in.empty() && n.in.size() == want, QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (",
          kind, ") takes ", one_or_two ? "1 or 2" : std::to_string(want), " input(s), got ", n.in.size());
    for (int v : n.in) {
      check_value(v, "node input");
      check(ready[v], QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind, ") reads value ", v,
            " before any node produces it; list nodes in execution order");
    }
    check_value(n.out, "node output");
    check(!ready[n.out], QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind, ") writes value ",
          n.out, ", which is already produced or fed");
    ready[n.out] = 1;

    const GraphValue& x = values_[n.in[0]];
    const GraphValue& y = values_[n.out];
    auto same_qparams = [](const GraphValue& a, const GraphValue& b) {
      return a.dtype != QPACK_DTYPE_U8 || (a.scale == b.scale && a.zero_point == b.zero_point);
    };
    auto expect_dtypes = [&](qpack_dtype in, qpack_dtype out) {
      for (int v : n.in) {
        check(values_[v].dtype == in, QPACK_STATUS_INVALID_TYPE, "node ", i, " (", kind,
              ") takes ", in == QPACK_DTYPE_F32 ? "f32" : "u8", " input, value ", v, " is ",
              values_[v].dtype == QPACK_DTYPE_F32 ? "f32" : "u8");
      }
      check(y.dtype == out, QPACK_STATUS_INVALID_TYPE, "node ", i, " (", kind, ") writes ",
            out == QPACK_DTYPE_F32 ? "f32" : "u8", ", value ", n.out, " is not");
    };
    auto expect_op_output = [&](const OpSpec& s) {
      if (!s.static_int8()) {
        expect_dtypes(QPACK_DTYPE_F32, QPACK_DTYPE_F32);
        return;
      }
      expect_dtypes(QPACK_DTYPE_U8, QPACK_DTYPE_U8);
      check(y.scale == s.output_scale && y.zero_point == s.output_zero_point,
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind, ") requantizes to (",
            s.output_scale, ", ", s.output_zero_point, ") but value ", n.out, " has (", y.scale,
            ", ", y.zero_point, ")");
    };
    switch (n.kind) {
      case QPACK_NODE_CONV2D:
        check(n.conv != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (conv2d) has no conv");
        expect_op_output(n.conv->spec());
        break;
      case QPACK_NODE_LINEAR:
        check(n.linear != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (linear) has no linear");
        expect_op_output(n.linear->spec());
        break;
      case QPACK_NODE_QUANTIZE: expect_dtypes(QPACK_DTYPE_F32, QPACK_DTYPE_U8); break;
      case QPACK_NODE_DEQUANTIZE: expect_dtypes(QPACK_DTYPE_U8, QPACK_DTYPE_F32); break;
      case QPACK_NODE_MAXPOOL2D:
      case QPACK_NODE_FLATTEN:
      case QPACK_NODE_CHANNELS:
      case QPACK_NODE_CHANNEL_RANGE:
      case QPACK_NODE_RESIZE_NEAREST:
      case QPACK_NODE_TRANSPOSE:
      case QPACK_NODE_DEPTH_TO_SPACE:
      case QPACK_NODE_PERMUTE_ROWS:
        expect_dtypes(x.dtype, x.dtype);
        check(same_qparams(x, y), QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind,
              ") keeps its input's u8 parameters; give value ", n.out, " those of value ", n.in[0]);
        break;
      case QPACK_NODE_CONSTANT: break;  // its input's data is not read, its output any dtype
      default: expect_dtypes(x.dtype, x.dtype); break;
    }
    if (n.kind == QPACK_NODE_MAXPOOL2D || n.kind == QPACK_NODE_AVGPOOL2D) {
      for (int a = 0; a < 2; ++a) {
        check(n.kernel[a] >= 1 && n.kernel[a] <= 4096 && n.stride[a] >= 1 && n.stride[a] <= 4096,
              QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind,
              "): kernel and stride must be in [1, 4096]");
      }
      for (int a = 0; a < 4; ++a) {
        check(n.pad[a] >= 0 && n.pad[a] <= n.kernel[a % 2] / 2, QPACK_STATUS_INVALID_ARGUMENT,
              "node ", i, " (", kind, "): padding must be in [0, kernel / 2], as in PyTorch");
      }
    }
    if (n.kind == QPACK_NODE_ADAPTIVE_AVGPOOL2D) {
      check(n.kernel[0] >= 1 && n.kernel[0] <= 4096 && n.kernel[1] >= 1 && n.kernel[1] <= 4096,
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (adaptive_avgpool2d): output size must be in [1, 4096]");
    }
    if (n.kind == QPACK_NODE_CHANNELS) {
      check(n.kernel[0] >= 1 && n.kernel[0] <= (int64_t(1) << 24) && n.kernel[1] >= 0 &&
                n.kernel[1] < n.kernel[0] && n.stride[0] >= 1 && n.stride[0] <= (int64_t(1) << 24),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (channels) needs parts in [1, 2^24], a part index in [0, parts) and groups in [1, 2^24]");
    }
    if (n.kind == QPACK_NODE_DEPTH_TO_SPACE) {
      check(n.kernel[0] >= 1 && n.kernel[0] <= 64 && n.kernel[1] >= 1 && n.kernel[1] <= 64,
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (depth_to_space) needs block sizes in [1, 64]");
    }
    if (n.kind == QPACK_NODE_CHANNEL_RANGE) {
      check(n.kernel[0] >= 0 && n.kernel[0] < (int64_t(1) << 24) && n.kernel[1] >= 1 &&
                n.kernel[1] <= (int64_t(1) << 24),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (channel_range) needs a first channel in [0, 2^24) and a count in [1, 2^24]");
    }
    if (resize) {
      const bool sized = n.kernel[0] >= 1 && n.kernel[0] <= (int64_t(1) << 20) && n.kernel[1] >= 1 &&
                         n.kernel[1] <= (int64_t(1) << 20);
      const bool unsized = n.kernel[0] == 0 && n.kernel[1] == 0;
      auto scale_ok = [](float s) { return s > 0.0f && s <= 65536.0f; };  // false for NaN
      const bool scaled = scale_ok(n.act_min) && scale_ok(n.act_max);
      const bool unscaled = n.act_min == 0.0f && n.act_max == 0.0f;
      check((sized || unsized) && (scaled || unscaled) && (n.in.size() == 2 || sized || scaled),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind, ") needs an output size in [1, 2^20] "
            "(kernel_h, kernel_w), scale factors in (0, 65536] (act_min, act_max) or a second input "
            "to take H and W from; got size (", n.kernel[0], ", ", n.kernel[1], "), scales (", n.act_min,
            ", ", n.act_max, ")");
      check(!n.ceil_mode || n.kind == QPACK_NODE_RESIZE_BILINEAR, QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (", kind, "): align_corners (ceil_mode) is for bilinear resizes only");
    }
    if (n.kind == QPACK_NODE_ATTENTION) {
      constexpr int64_t kMax = int64_t(1) << 24;
      check(n.kernel[0] >= 1 && n.kernel[0] <= kMax && n.kernel[1] >= 1 && n.kernel[1] <= kMax &&
                n.stride[0] >= 1 && n.stride[0] <= kMax,
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (attention) needs heads (kernel_h), a head dim "
            "(kernel_w) and a value head dim (stride_h) in [1, 2^24], got ", n.kernel[0], ", ", n.kernel[1],
            ", ", n.stride[0]);
      for (int a = 0; a < 3; ++a) {
        check(n.pad[a] >= 0 && n.pad[a] <= kMax, QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
              " (attention): where q, k and v start (pad_top, pad_left, pad_bottom) must be in [0, 2^24]");
      }
      check(n.stride[1] >= 0 && n.stride[1] <= kMax && n.pad[3] >= -1 && n.pad[3] <= kMax,
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (attention): the head strides (stride_w, pad_right) "
            "must be in [0, 2^24] (pad_right -1: k and v one head for all), got ", n.stride[1], ", ", n.pad[3]);
      check(std::isfinite(n.act_min), QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (attention) needs a finite scale (act_min), got ", n.act_min);
      for (float m : n.affine_scale) {
        check(!std::isnan(m) && m != std::numeric_limits<float>::infinity(), QPACK_STATUS_INVALID_ARGUMENT,
              "node ", i, " (attention): the mask must not hold NaN or +inf");
      }
      // act_max: the count G of window masks after the heads' [H][L][S] (0: none)
      const bool whole = n.act_max >= 0.0f && n.act_max <= float(1 << 20) && n.act_max == std::floor(n.act_max);
      const int64_t H = n.kernel[0], G = whole ? static_cast<int64_t>(n.act_max) : 0;
      const int64_t masks = static_cast<int64_t>(n.affine_scale.size());
      check(whole && (G == 0 || (masks > 0 && masks % (H + G) == 0)),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (attention): the window mask count (act_max) must be "
            "a whole number in [0, 2^20], with a mask of (heads + windows) x L x S values; got ", n.act_max,
            " windows, ", H, " heads and ", masks, " mask values");
    }
    if (n.kind == QPACK_NODE_PRELU) {
      check(!n.affine_scale.empty() && n.affine_scale.size() <= (size_t(1) << 24) && n.affine_shift.empty(),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (prelu) needs 1 to 2^24 slopes and no shift");
      for (float a : n.affine_scale) {
        check(std::isfinite(a), QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (prelu): slopes must be finite");
      }
    }
    if (n.kind == QPACK_NODE_PAD) {
      for (int a = 0; a < 4; ++a) {
        check(n.pad[a] >= 0 && n.pad[a] <= (int64_t(1) << 20), QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
              " (pad): pads (pad_top, pad_left, pad_bottom, pad_right) must be in [0, 2^20], got ", n.pad[a]);
      }
      check(std::isfinite(n.act_min), QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (pad) needs a finite border value (act_min), got ", n.act_min);
    }
    if (n.kind == QPACK_NODE_CONSTANT) {
      constexpr int64_t kMax = int64_t(1) << 24;
      check(n.kernel[0] >= 1 && n.kernel[0] <= kMax && n.kernel[1] >= 0 && n.kernel[1] <= kMax &&
                static_cast<int64_t>(n.affine_scale.size()) == n.kernel[0] * std::max<int64_t>(n.kernel[1], 1),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (constant) needs rows (kernel_h) in [1, 2^24], columns "
            "(kernel_w) in [0, 2^24] and rows x max(columns, 1) values, got ", n.kernel[0], ", ", n.kernel[1],
            " and ", n.affine_scale.size(), " values");
      for (float a : n.affine_scale) {
        check(std::isfinite(a), QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (constant): values must be finite");
      }
      if (y.dtype == QPACK_DTYPE_U8) {
        const Q qy{y.scale, y.zero_point};
        n.lut.resize(n.affine_scale.size());
        for (size_t j = 0; j < n.affine_scale.size(); ++j) n.lut[j] = qy.quant(n.affine_scale[j]);
      }
    }
    if (n.kind == QPACK_NODE_PERMUTE_ROWS) {
      constexpr int64_t kMax = int64_t(1) << 24;
      const int64_t R = static_cast<int64_t>(n.affine_scale.size());
      check(R >= 1 && R <= kMax && n.kernel[0] >= 1 && n.kernel[0] <= kMax && n.kernel[1] >= 0 &&
                n.kernel[1] <= kMax,
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (permute_rows) needs 1 to 2^24 rows in its permutation "
            "and output dims (kernel_h, kernel_w) in [1, 2^24] and [0, 2^24], got ", R, ", ", n.kernel[0], ", ",
            n.kernel[1]);
      std::vector<char> seen(static_cast<size_t>(R), 0);
      n.rows.resize(static_cast<size_t>(R));
      for (int64_t j = 0; j < R; ++j) {
        const float f = n.affine_scale[static_cast<size_t>(j)];
        const bool index = f >= 0.0f && f < static_cast<float>(R) && f == std::floor(f);
        check(index && !seen[static_cast<size_t>(f)], QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
              " (permute_rows): entry ", j, " (", f, ") is not a row index in [0, ", R,
              ") that no other entry names: the rows must be a permutation");
        seen[static_cast<size_t>(f)] = 1;
        n.rows[static_cast<size_t>(j)] = static_cast<int32_t>(f);
      }
    }
    if (n.kind == QPACK_NODE_LINEAR && n.act != QPACK_ACT_NONE) {
      // an activation fused after the layer: f32 (oneDNN's post-op, else applied after it)
      check(y.dtype == QPACK_DTYPE_F32, QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (linear): an activation after the linear is for f32 linears");
    }
    if (n.kind == QPACK_NODE_CONV2D && n.act != QPACK_ACT_NONE) {
      // an activation fused after the layer's own: f32, where the kernel applies it
      check(y.dtype == QPACK_DTYPE_F32 && n.conv->kernel().fuses_f32(n.act), QPACK_STATUS_INVALID_ARGUMENT,
            "node ", i, " (conv2d): activation ", static_cast<int>(n.act),
            " after the convolution is for f32 convolutions that fuse it (oneDNN's)");
    }
    if (n.kind == QPACK_NODE_ADD || n.kind == QPACK_NODE_ACTIVATION ||
        ((n.kind == QPACK_NODE_CONV2D || n.kind == QPACK_NODE_LINEAR) && n.act != QPACK_ACT_NONE)) {
      check(n.act >= QPACK_ACT_NONE && n.act <= kLastActivation, QPACK_STATUS_INVALID_ARGUMENT,
            "node ", i, " (", kind, ") has an unknown activation ", static_cast<int>(n.act));
      if (n.act == QPACK_ACT_LEAKY_RELU) {
        check(std::isfinite(n.act_min), QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind,
              "): leaky_relu needs a finite negative slope (act_min), got ", n.act_min);
      }
      if (n.act == QPACK_ACT_CLAMP) {
        check(!std::isnan(n.act_min) && !std::isnan(n.act_max) && n.act_min < n.act_max,
              QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind,
              "): clamp needs act_min < act_max, got (", n.act_min, ", ", n.act_max, ")");
      }
    }
    if (n.kind == QPACK_NODE_ACTIVATION && x.dtype == QPACK_DTYPE_U8) {
      const Q qi{x.scale, x.zero_point}, qo{y.scale, y.zero_point};
      n.lut.resize(256);
      for (int b = 0; b < 256; ++b) {
        n.lut[b] = qo.quant(activate(n.act, n.act_min, n.act_max, qi.deq(static_cast<uint8_t>(b))));
      }
    }
    if (n.kind == QPACK_NODE_AFFINE || n.kind == QPACK_NODE_LAYER_NORM) {
      check(!n.affine_scale.empty() && n.affine_scale.size() == n.affine_shift.size(),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind,
            ") needs scale and shift of one length (channels >= 1)");
      for (size_t c = 0; c < n.affine_scale.size(); ++c) {
        check(std::isfinite(n.affine_scale[c]) && std::isfinite(n.affine_shift[c]),
              QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " (", kind, "): scale and shift must be finite");
      }
    }
    if (n.kind == QPACK_NODE_LAYER_NORM) {
      check(n.act_min > 0.0f && std::isfinite(n.act_min), QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (layer_norm) needs a finite eps > 0 (act_min), got ", n.act_min);
      check(n.kernel[0] == 1 || n.kernel[0] == -1 || (n.kernel[0] == 0 && n.kernel[1] >= 1),
            QPACK_STATUS_INVALID_ARGUMENT, "node ", i,
            " (layer_norm) normalizes dim 1 or -1 (kernel_h), or kernel_w >= 1 groups of channels "
            "(kernel_h = 0), got kernel_h ", n.kernel[0], ", kernel_w ", n.kernel[1]);
    }
  }
  for (int v : outputs_) {
    check_value(v, "output");
    check(ready[v], QPACK_STATUS_INVALID_ARGUMENT, "output value ", v, " is never produced");
  }
  attach_backend_ops();
}

void Graph::attach_backend_ops() {
  bool mixed = false;
  for (const auto& n : nodes_) {
    const OpSpec* s = n.conv ? static_cast<const OpSpec*>(&n.conv->spec())
                             : n.linear ? static_cast<const OpSpec*>(&n.linear->spec()) : nullptr;
    if (s == nullptr || !s->static_int8()) continue;
    mixed = mixed || (backend_ != QPACK_BACKEND_AUTO && backend_ != s->backend);
    backend_ = s->backend;
  }
  if (mixed) backend_ = QPACK_BACKEND_AUTO;
  // QPACK_GRAPH_BACKEND_OPS=0: every such node in the C++ code (to compare, or to work around).
  static const bool off = [] {
    const char* e = std::getenv("QPACK_GRAPH_BACKEND_OPS");
    return e != nullptr && std::string(e) == "0";
  }();
  if (backend_ == QPACK_BACKEND_AUTO || off) return;
  const GraphOps& ops = backend(backend_).ops.graph;
  for (auto& n : nodes_) {
    if (values_[n.in[0]].dtype != QPACK_DTYPE_U8 || values_[n.out].dtype != QPACK_DTYPE_U8) continue;
    GraphOpDesc d;
    d.kind = n.kind;
    d.act = n.act;
    d.act_min = n.act_min;
    d.act_max = n.act_max;
    std::copy(n.kernel, n.kernel + 2, d.kernel);
    std::copy(n.stride, n.stride + 2, d.stride);
    std::copy(n.pad, n.pad + 4, d.pad);
    d.ceil_mode = n.ceil_mode;
    d.count_include_pad = n.count_include_pad;
    const GraphValue& x = values_[n.in[0]];
    const GraphValue& x1 = values_[n.in.size() > 1 ? n.in[1] : n.in[0]];
    d.x = QParams{x.scale, x.zero_point};
    d.x1 = QParams{x1.scale, x1.zero_point};
    d.y = QParams{values_[n.out].scale, values_[n.out].zero_point};
    if (GraphOps::Make make = ops.entry(d)) n.backend_op = make(d);
  }
}

std::string Graph::node_backend(size_t i) const {
  check(i < nodes_.size(), QPACK_STATUS_INVALID_ARGUMENT, "node ", i, " is outside [0, ",
        nodes_.size(), ")");
  const GraphNode& n = nodes_[i];
  if (n.conv) return backend(n.conv->spec().backend).name;
  if (n.linear) return backend(n.linear->spec().backend).name;
  if (n.kind == QPACK_NODE_ADD) {
    int into = -1;
    bool fused = false, apart = false;
    for (const auto& p : plans_.entries()) {
      const int c = p->fused_add[i];
      (c >= 0 ? fused : apart) = true;
      if (c >= 0) into = c;
    }
    if (fused) {
      return std::string(backend(nodes_[static_cast<size_t>(into)].conv->spec().backend).name) +
             " (sum post-op of node " + std::to_string(into) + ")" + (apart ? ", qpack for some shapes" : "");
    }
  }
  if (!n.backend_op) return "qpack";
  const std::string name = backend(backend_).name;
  bool native = false, fallback = false;
  for (const auto& p : plans_.entries()) (p->on_backend[i] ? native : fallback) = true;
  if (fallback && !native) return "qpack";
  return fallback ? name + ", qpack for some shapes" : name;
}

std::string Graph::value_layout(size_t v) const {
  check(v < values_.size(), QPACK_STATUS_INVALID_ARGUMENT, "value ", v, " is outside [0, ", values_.size(), ")");
  std::vector<std::string> seen;
  for (const auto& p : plans_.entries()) {
    const int rank = p->shapes[v].rank;
    const char* name = rank == 4 ? (p->nchw[v] ? "NCHW" : "NHWC") : p->nlc[v] ? "NLC" : "row-major";
    if (std::find(seen.begin(), seen.end(), name) == seen.end()) seen.push_back(name);
  }
  if (seen.empty()) return "unplanned";
  std::string out = seen[0];
  for (size_t k = 1; k < seen.size(); ++k) out += "/" + seen[k];
  return out;
}

size_t Graph::nbytes_packed() const {
  std::vector<const void*> seen;
  size_t total = 0;
  for (const auto& n : nodes_) {
    const void* op = n.conv ? static_cast<const void*>(n.conv.get()) : n.linear.get();
    if (op == nullptr || std::find(seen.begin(), seen.end(), op) != seen.end()) continue;
    seen.push_back(op);
    total += n.conv ? n.conv->kernel().nbytes_packed() : n.linear->kernel().nbytes_packed();
  }
  return total;
}

size_t Graph::nbytes_constants() const {
  size_t total = 0;
  for (const auto& n : nodes_) {
    total += (n.affine_scale.size() + n.affine_shift.size()) * sizeof(float) + n.lut.size() +
             n.rows.size() * sizeof(int32_t);
  }
  return total;
}

// ---- planning: shapes and buffers ---------------------------------------------------

// Residual adds as their convolution's sum post-op: add(c, r) where c is a
// convolution's output that only the add reads and r was made before that
// convolution and is read after it by the add alone. The convolution then
// runs on r's buffer, adding its result there (ConvShape::sum, the add's
// activation after), and the add is skipped: one pass over the values less,
// where the kernel takes it (ConvKernel::fuses_sum). r is not in the caller's
// memory and none of the three is a graph output. u8: c is never rounded, so
// the add's output moves by at most half a quantum of c from the per-edge
// result: fused only where that is at most one quantum of the output.
// QPACK_GRAPH_FUSE_ADD=0 keeps every add a node of its own.
void Graph::fuse_adds(GraphPlan* p) const {
  const int steps = static_cast<int>(nodes_.size());
  p->fused_add.assign(nodes_.size(), -1);
  static const bool enabled = [] {
    const char* e = std::getenv("QPACK_GRAPH_FUSE_ADD");
    return e == nullptr || std::string(e) != "0";
  }();
  if (!enabled) return;
  std::vector<int> producer(values_.size(), -1), reads(values_.size(), 0);
  for (int i = 0; i < steps; ++i) {
    producer[nodes_[i].out] = i;
    for (int v : nodes_[i].in) ++reads[v];
  }
  auto output = [&](int v) { return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end(); };
  for (int j = 0; j < steps; ++j) {
    const GraphNode& add = nodes_[j];
    if (add.kind != QPACK_NODE_ADD || add.in.size() != 2 || add.in[0] == add.in[1] ||
        p->shapes[add.out].rank != 4 || output(add.out) || p->nchw[add.out] || p->on_backend[j]) {
      continue;
    }
    const GraphValue& y = values_[add.out];
    const bool u8 = y.dtype == QPACK_DTYPE_U8;
    for (int k = 0; k < 2; ++k) {
      const int c = add.in[k], r = add.in[1 - k], i = producer[c];
      if (i < 0 || nodes_[i].kind != QPACK_NODE_CONV2D || !nodes_[i].conv || reads[c] != 1 || output(c) ||
          output(r) || p->nchw[c] || p->nchw[r] || producer[r] >= i || (producer[r] < 0 && p->external[r]) ||
          !(p->shapes[r] == p->shapes[c])) {
        continue;
      }
      // r's readers other than the add come before the convolution
      bool read_late = false;
      for (int m = i; m < steps; ++m) {
        if (m != j && std::find(nodes_[m].in.begin(), nodes_[m].in.end(), r) != nodes_[m].in.end()) read_late = true;
      }
      if (read_late) continue;
      if (u8 && !(values_[c].scale <= 2.0f * y.scale)) continue;
      if (!nodes_[i].conv->kernel().fuses_sum(conv_shape(nodes_[i], *p, j))) continue;
      p->fused_add[static_cast<size_t>(i)] = j;
      p->fused_add[static_cast<size_t>(j)] = i;
      break;
    }
  }
}

Shape Graph::infer(const GraphNode& n, const std::vector<Shape>& shapes) const {
  const Shape& x = shapes[n.in[0]];
  const char* kind = kind_name(n.kind);
  auto need_rank = [&](bool ok, const char* what) {
    check(ok, QPACK_STATUS_INVALID_ARGUMENT, kind, " takes ", what, ", got shape ", shape_str(x));
  };
  Shape y = x;
  switch (n.kind) {
    case QPACK_NODE_CONV2D: {
      const ConvSpec& s = n.conv->spec();
      need_rank((x.rank == 4 || x.rank == 3) && x.d[1] == s.IC,
                "[N, in_channels, H, W] input (or [N, in_channels, L] for a 1-D convolution)");
      y.d[1] = s.OC;
      if (x.rank == 3) {  // conv1d: the 2-D op with height 1, on row-major [N, C, L]
        int64_t oh = 0;
        s.output_size(1, x.d[2], &oh, &y.d[2]);
        return y;
      }
      s.output_size(x.d[2], x.d[3], &y.d[2], &y.d[3]);
      return y;
    }
    case QPACK_NODE_LINEAR: {
      const LinearSpec& s = n.linear->spec();
      if (n.ceil_mode) {  // per pixel: over the channels of a rank-4 value (its NHWC rows)
        need_rank(x.rank == 4 && x.d[1] == s.K, "(per pixel) a rank-4 input whose dim 1 is in_features");
        y.d[1] = s.N;
        return y;
      }
      need_rank((x.rank == 2 || x.rank == 3) && x.d[x.rank - 1] == s.K,
                "a rank-2 or rank-3 input whose last dim is in_features");
      y.d[x.rank - 1] = s.N;
      return y;
    }
    case QPACK_NODE_ADD:
      check(shapes[n.in[1]] == x, QPACK_STATUS_INVALID_ARGUMENT, "add takes equal shapes, got ",
            shape_str(x), " and ", shape_str(shapes[n.in[1]]));
      return y;
    case QPACK_NODE_MUL: {
      const Shape& s = shapes[n.in[1]];
      auto scales = [](const Shape& big, const Shape& small) {
        return big.rank == 4 && small.rank == 4 && small.d[0] == big.d[0] &&
               small.d[1] == big.d[1] && small.d[2] == 1 && small.d[3] == 1;
      };
      check(s == x || scales(x, s) || scales(s, x), QPACK_STATUS_INVALID_ARGUMENT,
            "mul takes equal shapes, or [N, C, H, W] and [N, C, 1, 1] in either order, got ",
            shape_str(x), " and ", shape_str(s));
      return scales(s, x) ? s : y;
    }
    case QPACK_NODE_MAXPOOL2D:
    case QPACK_NODE_AVGPOOL2D:
      need_rank(x.rank == 4, "a rank-4 [N, C, H, W] input");
      y.d[2] = pooled(x.d[2], n.kernel[0], n.stride[0], n.pad[0], n.pad[2], n.ceil_mode);
      y.d[3] = pooled(x.d[3], n.kernel[1], n.stride[1], n.pad[1], n.pad[3], n.ceil_mode);
      return y;
    case QPACK_NODE_GLOBAL_AVGPOOL:
      need_rank(x.rank == 4 || x.rank == 3, "a rank-4 [N, C, H, W] or rank-3 [N, C, L] input");
      if (x.rank == 3) {  // mean over L
        y.rank = n.keepdim ? 3 : 2;
        y.d[2] = n.keepdim ? 1 : 0;
        return y;
      }
      if (n.keepdim) {
        y.d[2] = y.d[3] = 1;
      } else {
        y.rank = 2;
        y.d[2] = y.d[3] = 0;
      }
      return y;
    case QPACK_NODE_FLATTEN:
      need_rank(x.rank >= 2, "an input of rank 2 or more");
      y.rank = 2;
      y.d[1] = x.numel() / std::max<int64_t>(x.d[0], 1);
      if (x.d[0] == 0) {
        y.d[1] = 1;
        for (int i = 1; i < x.rank; ++i) y.d[1] *= x.d[i];
      }
      y.d[2] = y.d[3] = 0;
      return y;
    case QPACK_NODE_CONCAT: {
      need_rank(x.rank >= 2, "inputs of rank 2 or more");
      y.d[1] = 0;
      for (int v : n.in) {
        Shape a = shapes[v], b = x;
        a.d[1] = b.d[1] = 0;
        check(a == b, QPACK_STATUS_INVALID_ARGUMENT, "concat inputs differ outside dim 1: ",
              shape_str(shapes[v]), " and ", shape_str(x));
        y.d[1] += shapes[v].d[1];
      }
      return y;
    }
    case QPACK_NODE_PAD:
      need_rank(x.rank == 4, "a rank-4 [N, C, H, W] input");
      y.d[2] = x.d[2] + n.pad[0] + n.pad[2];
      y.d[3] = x.d[3] + n.pad[1] + n.pad[3];
      return y;
    case QPACK_NODE_CONSTANT:
      need_rank(x.rank >= 1, "an input of rank 1 or more (its dim 0 the batch)");
      y = Shape{};
      y.rank = n.kernel[1] > 0 ? 3 : 2;
      y.d[0] = x.d[0];
      y.d[1] = n.kernel[0];
      y.d[2] = n.kernel[1];
      return y;
    case QPACK_NODE_PERMUTE_ROWS: {
      need_rank(x.rank == 3 || x.rank == 4, "a rank-3 [N, L, C] or rank-4 [N, C, H, W] input");
      const int64_t C = x.rank == 4 ? x.d[1] : x.d[2];
      const int64_t T = C > 0 ? x.numel() / C : 0;
      const int64_t R = static_cast<int64_t>(n.rows.size());
      const int64_t per = n.kernel[0] * std::max<int64_t>(n.kernel[1], 1);  // rows per output sample
      check(C > 0 && T % R == 0 && T % per == 0, QPACK_STATUS_INVALID_ARGUMENT, "permute_rows of blocks of ", R,
            " rows into samples of ", per, " takes rows of at least one value that both divide, got ",
            shape_str(x));
      y = Shape{};
      y.d[0] = T / per;
      if (n.kernel[1] == 0) {
        y.rank = 3;
        y.d[1] = n.kernel[0];
        y.d[2] = C;
      } else {
        y.rank = 4;
        y.d[1] = C;
        y.d[2] = n.kernel[0];
        y.d[3] = n.kernel[1];
      }
      return y;
    }
    case QPACK_NODE_ADAPTIVE_AVGPOOL2D:
      need_rank(x.rank == 4, "a rank-4 [N, C, H, W] input");
      y.d[2] = n.kernel[0];
      y.d[3] = n.kernel[1];
      return y;
    case QPACK_NODE_CHANNELS:
      need_rank(x.rank >= 2 && x.d[1] % n.kernel[0] == 0 && (x.d[1] / n.kernel[0]) % n.stride[0] == 0,
                "an input whose dim 1 divides into the parts, and each part into the groups");
      y.d[1] = x.d[1] / n.kernel[0];
      return y;
    case QPACK_NODE_DEPTH_TO_SPACE:
      need_rank(x.rank == 4 && x.d[1] % (n.kernel[0] * n.kernel[1]) == 0,
                "a rank-4 input whose channels divide into kernel_h x kernel_w blocks");
      y.d[1] = x.d[1] / (n.kernel[0] * n.kernel[1]);
      y.d[2] = x.d[2] * n.kernel[0];
      y.d[3] = x.d[3] * n.kernel[1];
      return y;
    case QPACK_NODE_TRANSPOSE:
      if (n.in.size() == 2) {  // tokens [N, H W, C] -> the image [N, C, H, W] of the second input's H, W
        const Shape& like = shapes[n.in[1]];
        check(x.rank == 3 && like.rank == 4 && like.d[2] * like.d[3] == x.d[1], QPACK_STATUS_INVALID_ARGUMENT,
              "transpose to an image takes tokens [N, H W, C] and a rank-4 value of that H and W, got ",
              shape_str(x), " and ", shape_str(like));
        y.rank = 4;
        y.d[1] = x.d[2];
        y.d[2] = like.d[2];
        y.d[3] = like.d[3];
        return y;
      }
      if (x.rank == 4) {  // an image's tokens [N, H W, C]
        y.rank = 3;
        y.d[1] = x.d[2] * x.d[3];
        y.d[2] = x.d[1];
        y.d[3] = 0;
        return y;
      }
      need_rank(x.rank == 3, "a rank-3 input, or a rank-4 one (its tokens)");
      y.d[1] = x.d[2];
      y.d[2] = x.d[1];
      return y;
    case QPACK_NODE_ATTENTION: {
      const Shape& k = shapes[n.in[1]];
      const Shape& v = shapes[n.in[2]];
      const int64_t H = n.kernel[0], D = n.kernel[1], Dv = n.stride[0];
      const int64_t hs = attention_qk_stride(n), vs = attention_v_stride(n);  // head to head
      const int64_t kv_heads = attention_multi_query(n) ? 1 : H;
      check(x.rank == 3 && k.rank == 3 && v.rank == 3 && k.d[0] == x.d[0] && v.d[0] == x.d[0] &&
                v.d[1] == k.d[1] && x.d[2] >= n.pad[0] + (H - 1) * hs + D &&
                k.d[2] >= n.pad[1] + (kv_heads - 1) * hs + D && v.d[2] >= n.pad[2] + (kv_heads - 1) * vs + Dv,
            QPACK_STATUS_INVALID_ARGUMENT, "attention of ", H,
            kv_heads == 1 && H > 1 ? " q heads over one k and v head (" : " heads (", D, " q / k, ", Dv,
            " v features each, from ", n.pad[0], ", ", n.pad[1], ", ", n.pad[2],
            ") takes q [N, L, Cq], k [N, S, Ck] and v [N, S, Cv] holding them, got ", shape_str(x), ", ",
            shape_str(k), " and ", shape_str(v));
      check(x.d[1] == 0 || k.d[1] > 0, QPACK_STATUS_INVALID_ARGUMENT, "attention of ", x.d[1],
            " queries over no keys: ", shape_str(k));
      const int64_t LS = x.d[1] * k.d[1], masks = static_cast<int64_t>(n.affine_scale.size());
      const int64_t windows = attention_windows(n);
      check(windows == 0 || (masks == (H + windows) * LS && x.d[0] % windows == 0),
            QPACK_STATUS_INVALID_ARGUMENT, "attention's mask holds ", masks, " values, not (H + G) x L x S = (",
            H, " + ", windows, ") x ", LS, " (the heads' masks, then G windows' for a batch of G's multiples) for q ",
            shape_str(x), " and k ", shape_str(k));
      const int64_t groups = LS > 0 && masks > LS ? masks / (H * LS) : 1;  // masks per head over the batch
      check(windows > 0 || masks == 0 || masks == LS || (masks == groups * H * LS && x.d[0] % groups == 0),
            QPACK_STATUS_INVALID_ARGUMENT, "attention's mask holds ", masks, " values, not L x S = ", LS,
            " (or H x L x S, or G x H x L x S for a batch of G's multiples) for q ", shape_str(x), " and k ",
            shape_str(k));
      y.d[2] = H * Dv;
      return y;
    }
    case QPACK_NODE_CHANNEL_RANGE:
      need_rank(x.rank >= 2 && n.kernel[0] + n.kernel[1] <= x.d[1],
                "an input whose dim 1 holds the channel range");
      y.d[1] = n.kernel[1];
      return y;
    case QPACK_NODE_AFFINE:
      need_rank(x.rank >= 2 && (n.affine_scale.size() == 1 ||
                                x.d[n.kernel[0] == -1 ? x.rank - 1 : 1] == static_cast<int64_t>(n.affine_scale.size())),
                n.kernel[0] == -1 ? "an input whose last dim has as many values as the affine"
                                  : "an input whose dim 1 has as many channels as the affine");
      return y;
    case QPACK_NODE_LAYER_NORM:
      if (n.kernel[0] == 0) {  // group norm: dim 1's channels in kernel_w groups
        need_rank(x.rank >= 2 && x.d[1] == static_cast<int64_t>(n.affine_scale.size()) && x.d[1] % n.kernel[1] == 0,
                  "an input whose dim 1 has as many channels as the scale and shift, a multiple of the groups");
        return y;
      }
      need_rank(x.rank >= 2 && x.d[n.kernel[0] == 1 ? 1 : x.rank - 1] == static_cast<int64_t>(n.affine_scale.size()),
                "an input whose normalized dim has as many values as the scale and shift");
      return y;
    case QPACK_NODE_PRELU:
      need_rank(x.rank >= 2 && (n.affine_scale.size() == 1 || x.d[1] == static_cast<int64_t>(n.affine_scale.size())),
                "an input whose dim 1 has as many channels as the slopes (or one slope)");
      return y;
    case QPACK_NODE_RESIZE_NEAREST:
    case QPACK_NODE_RESIZE_BILINEAR: {
      need_rank(x.rank == 4, "a rank-4 [N, C, H, W] input");
      if (n.in.size() == 2) {
        const Shape& like = shapes[n.in[1]];
        check(like.rank == 4, QPACK_STATUS_INVALID_ARGUMENT, kind,
              " takes H and W from a rank-4 second input, got shape ", shape_str(like));
        y.d[2] = like.d[2];
        y.d[3] = like.d[3];
      } else if (n.kernel[0] > 0) {
        y.d[2] = n.kernel[0];
        y.d[3] = n.kernel[1];
      } else {  // as F.interpolate: floor(in * scale_factor)
        y.d[2] = static_cast<int64_t>(std::floor(static_cast<double>(x.d[2]) * n.act_min));
        y.d[3] = static_cast<int64_t>(std::floor(static_cast<double>(x.d[3]) * n.act_max));
      }
      check(y.d[2] >= 1 && y.d[3] >= 1 && y.d[2] <= (int64_t(1) << 31) && y.d[3] <= (int64_t(1) << 31) &&
                ((x.d[2] >= 1 && x.d[3] >= 1) || x.d[0] * x.d[1] == 0),
            QPACK_STATUS_INVALID_ARGUMENT, kind, " of ", shape_str(x), " to ", y.d[2], " x ", y.d[3],
            ": input and output H and W must be in [1, 2^31]");
      return y;
    }
    default: return y;  // elementwise
  }
}

ConvShape Graph::conv_shape(const GraphNode& n, const GraphPlan& plan, int add) const {
  const Shape& xs = plan.shapes[n.in[0]];
  const Shape& ys = plan.shapes[n.out];
  // rank 3: [N, C, L] is NCHW with height 1 row-major, NHWC where held channels-last (plan.nlc)
  ConvShape s = xs.rank == 3 ? ConvShape{xs.d[0], 1, xs.d[2], 1, ys.d[2],
                                         plan.nlc[n.in[0]] ? QPACK_LAYOUT_NHWC : QPACK_LAYOUT_NCHW,
                                         plan.nlc[n.out] ? QPACK_LAYOUT_NHWC : QPACK_LAYOUT_NCHW}
                             : ConvShape{xs.d[0], xs.d[2], xs.d[3], ys.d[2], ys.d[3],
                                         plan.nchw[n.in[0]] ? QPACK_LAYOUT_NCHW : QPACK_LAYOUT_NHWC,
                                         plan.nchw[n.out] ? QPACK_LAYOUT_NCHW : QPACK_LAYOUT_NHWC};
  if (values_[n.out].dtype == QPACK_DTYPE_F32) {  // a u8 layer's own activation is its spec's
    s.post_act = n.act;
    s.post_min = n.act_min;
    s.post_max = n.act_max;
  }
  if (add >= 0) {  // y holds the add's other operand (fuse_adds, make_plan)
    const GraphNode& a = nodes_[static_cast<size_t>(add)];
    const GraphValue& r = values_[a.in[0] == n.out ? a.in[1] : a.in[0]];
    s.sum = true;
    s.sum_act = a.act;
    s.sum_min = a.act_min;
    s.sum_max = a.act_max;
    s.sum_scale = r.scale;
    s.sum_zp = r.zero_point;
    s.out_scale = values_[a.out].scale;
    s.out_zp = values_[a.out].zero_point;
  }
  return s;
}

bool Graph::planar_conv(const GraphNode& n, const std::vector<Shape>& shapes) const {
  const Shape& xs = shapes[n.in[0]];
  const Shape& ys = shapes[n.out];
  if (n.kind != QPACK_NODE_CONV2D || n.conv == nullptr || xs.rank != 4 ||
      values_[n.in[0]].dtype != QPACK_DTYPE_F32) {
    return false;
  }
  ConvShape s{xs.d[0], xs.d[2], xs.d[3], ys.d[2], ys.d[3], QPACK_LAYOUT_NCHW, QPACK_LAYOUT_NCHW};
  s.post_act = n.act;
  s.post_min = n.act_min;
  s.post_max = n.act_max;
  return n.conv->kernel().fast_on_nchw_f32(s);
}

// Rank-3 values [N, C, L] that only 1-D convolutions and element-wise ops
// (activations, equal-shape adds, quantize, dequantize) touch are held
// channels-last, [N, L, C], as rank-4 values are NHWC: the convolutions' own
// layout, so a chain of them runs without the two transposes each one made
// (Conv1d 256 -> 256 over 400 steps, u8: 23 us each, most of a pointwise's
// time). The values such ops connect form one group, all channels-last or
// none: a group with a graph input, another reader or another producer stays
// row-major. Graph outputs among them are transposed on the way out; a
// transpose node reads and writes either order (a Conv1d's output transposed
// for a Linear, in channels-last, is a copy).
void Graph::nlc_values(GraphPlan* p) const {
  const int nv = static_cast<int>(values_.size());
  auto rank3 = [&](int v) { return p->shapes[v].rank == 3; };
  auto conv1d = [&](const GraphNode& n, size_t i) {
    return n.kind == QPACK_NODE_CONV2D && n.conv != nullptr && rank3(n.in[0]) && !p->on_backend[i];
  };
  auto elementwise = [&](const GraphNode& n) {
    if (n.kind != QPACK_NODE_ACTIVATION && n.kind != QPACK_NODE_ADD && n.kind != QPACK_NODE_QUANTIZE &&
        n.kind != QPACK_NODE_DEQUANTIZE) {
      return false;
    }
    if (!rank3(n.out)) return false;
    for (int v : n.in) {
      if (!rank3(v) || !(p->shapes[v] == p->shapes[n.out])) return false;
    }
    return true;
  };
  std::vector<int> group(static_cast<size_t>(nv));
  for (int v = 0; v < nv; ++v) group[v] = v;
  std::function<int(int)> find = [&](int v) { return group[v] == v ? v : group[v] = find(group[v]); };
  for (const auto& n : nodes_) {
    if (!elementwise(n)) continue;
    for (int v : n.in) group[find(v)] = find(n.out);
  }
  std::vector<char> ok(static_cast<size_t>(nv), 1), has_conv(static_cast<size_t>(nv), 0);
  for (int v = 0; v < nv; ++v) {
    if (!rank3(v)) ok[find(v)] = 0;
  }
  for (int v : inputs_) ok[find(v)] = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const GraphNode& n = nodes_[i];
    const bool ew = elementwise(n), conv = conv1d(n, i), swap = n.kind == QPACK_NODE_TRANSPOSE;
    if (conv) has_conv[find(n.out)] = 1;
    if (swap) continue;  // reads and writes either order (a copy or a transpose)
    if (!ew && !conv) {  // another producer or reader: its values stay row-major
      ok[find(n.out)] = 0;
      for (int v : n.in) ok[find(v)] = 0;
    }
  }
  for (int v = 0; v < nv; ++v) p->nlc[v] = ok[find(v)] && has_conv[find(v)];
}

GraphPlan Graph::make_plan(const qpack_tensor* inputs) const {
  GraphPlan p;
  const size_t nv = values_.size();
  p.shapes.assign(nv, Shape{});
  p.offsets.assign(nv, 0);
  p.external.assign(nv, false);
  p.nchw.assign(nv, false);
  p.nlc.assign(nv, false);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const qpack_tensor& t = inputs[i];
    Shape s;
    s.rank = t.ndim;
    for (int a = 0; a < t.ndim; ++a) s.d[a] = t.dims[a];
    p.input_shapes.push_back(s);
    p.input_layouts.push_back(t.ndim == 4 ? t.layout : QPACK_LAYOUT_NCHW);
    p.shapes[inputs_[i]] = s;
  }
  for (const auto& n : nodes_) p.shapes[n.out] = infer(n, p.shapes);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const qpack_tensor& t = inputs[i];
    // Used where it is, unless a rank-4 input must become NHWC: quantize nodes
    // read NCHW themselves (they transpose the bytes), and so do convolutions
    // of an input of few channels (an image's 3: oneDNN picks its kernel for
    // it) and those whose kernel is fast on planar data (fp32 depthwise,
    // ConvKernel::fast_on_nchw_f32); other consumers, and convolutions from
    // 16 channels, take a copy converted by the tiled transpose, faster there
    // than oneDNN's NCHW path (fp32, 1 thread, NCHW in and out, interleaved:
    // depthwise 3x3 x144 @56^2 686 -> 515 us, x96 @112^2 stride 2 1479 ->
    // 1002, 1x1 96->576 @14^2 429 -> 407; dense 3x3 64 @56^2 and 256 @14^2
    // within 3 %).
    const bool nchw = t.ndim == 4 && t.layout == QPACK_LAYOUT_NCHW;
    const bool few_channels = t.ndim == 4 && t.dims[1] < 16;
    bool direct = true;
    for (const auto& n : nodes_) {
      const bool reads = std::find(n.in.begin(), n.in.end(), inputs_[i]) != n.in.end();
      const bool in_place = n.kind == QPACK_NODE_QUANTIZE ||
                            (n.kind == QPACK_NODE_CONV2D && (few_channels || planar_conv(n, p.shapes)));
      if (reads && !in_place) direct = false;
    }
    p.nchw[inputs_[i]] = nchw && direct;
    p.external[inputs_[i]] = !nchw || direct;
  }
  p.on_backend.assign(nodes_.size(), false);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const GraphNode& n = nodes_[i];
    p.on_backend[i] = n.backend_op && n.backend_op->accepts(p.shapes[n.in[0]], p.shapes[n.out]);
  }
  fuse_adds(&p);
  nlc_values(&p);
  // Outputs only the caller reads that their node writes NCHW itself: a
  // convolution's fast on planar data whose input is NCHW; a dequantize's,
  // transposing on the way (one pass instead of two), where no input came
  // channels-last (then the caller wants NCHW out: qpack/torch/graph.py's
  // _run_handle).
  auto caller_only = [&](int v) {
    for (const auto& m : nodes_) {
      if (std::find(m.in.begin(), m.in.end(), v) != m.in.end()) return false;
    }
    return true;
  };
  const bool planar_in = std::find(p.input_layouts.begin(), p.input_layouts.end(), QPACK_LAYOUT_NHWC) ==
                         p.input_layouts.end();
  for (const auto& n : nodes_) {
    const bool conv = n.kind == QPACK_NODE_CONV2D && p.nchw[n.in[0]] && planar_conv(n, p.shapes);
    const bool dequantize = n.kind == QPACK_NODE_DEQUANTIZE && planar_in && p.shapes[n.out].rank == 4 &&
                            !p.nchw[n.in[0]];
    if (conv || dequantize) p.nchw[n.out] = caller_only(n.out);
  }
  // A quantize of an NCHW input of few channels (an image's 3) whose readers
  // are all convolutions keeps NCHW: the convolution converts u8 (oneDNN's
  // reorder), faster there than the quantize's element-wise transpose. From
  // 16 channels the quantize's block transpose is the faster, and up to 4
  // so is its interleaving kernel where the CPU has it (AVX-512 VBMI: the
  // [1, 3, 224, 224] image into ResNet-18's 7x7 / 2 and MobileNetV2's 3x3 / 2
  // convolutions, one Zen 5 thread: their u8 reorder took 36 us of each).
  for (const auto& n : nodes_) {
    if (n.kind != QPACK_NODE_QUANTIZE || !p.nchw[n.in[0]] || p.shapes[n.out].d[1] >= 16 ||
        quantize_interleave_u8_vectorized(p.shapes[n.out].d[1])) {
      continue;
    }
    bool convs_only = std::find(outputs_.begin(), outputs_.end(), n.out) == outputs_.end();
    for (const auto& m : nodes_) {
      if (std::find(m.in.begin(), m.in.end(), n.out) != m.in.end() && m.kind != QPACK_NODE_CONV2D) {
        convs_only = false;
      }
    }
    p.nchw[n.out] = convs_only;
  }

  // Buffers by liveness: a value lives from its producer to its last reader
  // (outputs to the end); first fit over the live blocks.
  const int steps = static_cast<int>(nodes_.size());
  std::vector<int> born(nv, -1), dies(nv, -1);
  for (int v : inputs_) dies[v] = 0;
  for (int i = 0; i < steps; ++i) {
    born[nodes_[i].out] = i;
    dies[nodes_[i].out] = std::max(dies[nodes_[i].out], i);
    for (int v : nodes_[i].in) dies[v] = std::max(dies[v], i);
  }
  for (int v : outputs_) dies[v] = steps;
  struct Block {
    size_t offset, size;
    int dies;
  };
  std::vector<Block> live;
  auto place = [&](int v, int now) {
    live.erase(std::remove_if(live.begin(), live.end(), [&](const Block& b) { return b.dies < now; }),
               live.end());
    const size_t size = (static_cast<size_t>(p.shapes[v].numel()) * elem_size(values_[v].dtype) + 63) / 64 * 64;
    std::sort(live.begin(), live.end(), [](const Block& a, const Block& b) { return a.offset < b.offset; });
    size_t offset = 0;
    for (const Block& b : live) {
      if (offset + size <= b.offset) break;
      offset = std::max(offset, b.offset + b.size);
    }
    live.push_back(Block{offset, size, dies[v]});
    p.offsets[v] = offset;
    p.workspace = std::max(p.workspace, offset + size);
  };
  for (int v : inputs_) {
    if (!p.external[v]) place(v, -1);
  }
  for (int i = 0; i < steps; ++i) {
    const int j = p.fused_add[static_cast<size_t>(i)];
    if (j < 0) {
      place(nodes_[i].out, i);
    } else if (nodes_[i].kind == QPACK_NODE_CONV2D) {
      // the convolution and its add write the other operand's buffer, which
      // then lives as long as the add's output
      const GraphNode& add = nodes_[static_cast<size_t>(j)];
      const int r = add.in[0] == nodes_[i].out ? add.in[1] : add.in[0];
      p.offsets[nodes_[i].out] = p.offsets[add.out] = p.offsets[r];
      for (Block& b : live) {
        if (b.offset == p.offsets[r]) b.dies = std::max(b.dies, dies[add.out]);
      }
    }
  }
  return p;
}

std::shared_ptr<const GraphPlan> Graph::plan_for(const qpack_tensor* inputs, int num_inputs,
                                                 const qpack_tensor* outputs, int num_outputs) const {
  check(outputs != nullptr && num_outputs == static_cast<int>(outputs_.size()),
        QPACK_STATUS_INVALID_ARGUMENT, "this graph has ", outputs_.size(), " output(s), got ",
        num_outputs);
  check(num_inputs == static_cast<int>(inputs_.size()), QPACK_STATUS_INVALID_ARGUMENT,
        "this graph takes ", inputs_.size(), " input(s), got ", num_inputs);
  check(inputs != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "inputs is NULL");
  for (int i = 0; i < num_inputs; ++i) {
    const qpack_tensor& t = inputs[i];
    const GraphValue& v = values_[inputs_[i]];
    check(t.dtype == v.dtype, QPACK_STATUS_INVALID_TYPE, "input ", i, " must be ",
          v.dtype == QPACK_DTYPE_F32 ? "f32" : "u8");
    check(t.ndim >= 1 && t.ndim <= 4, QPACK_STATUS_INVALID_ARGUMENT, "input ", i,
          " must have 1 to 4 dims, got ", t.ndim);
    int64_t total = 1;
    for (int a = 0; a < t.ndim; ++a) {
      check(t.dims[a] >= 0 && t.dims[a] <= (int64_t(1) << 31), QPACK_STATUS_INVALID_ARGUMENT,
            "input ", i, " dim ", a, " = ", t.dims[a], " is outside [0, 2^31]");
      total *= std::max<int64_t>(t.dims[a], 1);
      check(total <= (int64_t(1) << 36), QPACK_STATUS_INVALID_ARGUMENT, "input ", i, " is too large");
    }
    check(t.ndim != 4 || t.layout == QPACK_LAYOUT_NCHW || t.layout == QPACK_LAYOUT_NHWC,
          QPACK_STATUS_INVALID_ARGUMENT, "input ", i, " layout must be NCHW or NHWC");
  }
  auto matches = [&](const GraphPlan& p) {
    for (int i = 0; i < num_inputs; ++i) {
      Shape s;
      s.rank = inputs[i].ndim;
      for (int a = 0; a < s.rank; ++a) s.d[a] = inputs[i].dims[a];
      const qpack_layout l = s.rank == 4 ? inputs[i].layout : QPACK_LAYOUT_NCHW;
      if (!(p.input_shapes[i] == s) || p.input_layouts[i] != l) return false;
    }
    return true;
  };
  return plans_.get(matches, [&] {
    GraphPlan p = make_plan(inputs);
    counters_.built();
    size_t seen = max_workspace_.load();
    while (p.workspace > seen && !max_workspace_.compare_exchange_weak(seen, p.workspace)) {
    }
    return p;
  });
}

void Graph::output_shapes(const qpack_tensor* inputs, int num_inputs, qpack_tensor* outputs,
                          int num_outputs) const {
  auto plan = plan_for(inputs, num_inputs, outputs, num_outputs);
  for (int i = 0; i < num_outputs; ++i) {
    const Shape& s = plan->shapes[outputs_[i]];
    outputs[i].dtype = values_[outputs_[i]].dtype;
    outputs[i].ndim = s.rank;
    for (int a = 0; a < 4; ++a) outputs[i].dims[a] = a < s.rank ? s.d[a] : 0;
  }
}

// ---- running ----------------------------------------------------------------------------

void Graph::run(const qpack_tensor* inputs, int num_inputs, qpack_tensor* outputs,
                int num_outputs) const {
  auto plan = plan_for(inputs, num_inputs, outputs, num_outputs);
  for (int i = 0; i < num_outputs; ++i) {
    const qpack_tensor& t = outputs[i];
    const Shape& s = plan->shapes[outputs_[i]];
    bool same = t.ndim == s.rank && t.dtype == values_[outputs_[i]].dtype;
    for (int a = 0; same && a < s.rank; ++a) same = t.dims[a] == s.d[a];
    check(same, QPACK_STATUS_INVALID_ARGUMENT, "output ", i, " must be ",
          values_[outputs_[i]].dtype == QPACK_DTYPE_F32 ? "f32 " : "u8 ", shape_str(s),
          " (qpack_graph_output_shapes gives it)");
    check(s.rank != 4 || t.layout == QPACK_LAYOUT_NCHW || t.layout == QPACK_LAYOUT_NHWC,
          QPACK_STATUS_INVALID_ARGUMENT, "output ", i, " layout must be NCHW or NHWC");
    check(t.data != nullptr || s.numel() == 0, QPACK_STATUS_INVALID_ARGUMENT, "output ", i,
          " data is NULL");
  }
  for (int i = 0; i < num_inputs; ++i) {
    check(inputs[i].data != nullptr || plan->input_shapes[i].numel() == 0,
          QPACK_STATUS_INVALID_ARGUMENT, "input ", i, " data is NULL");
  }
  counters_.ran();
  uint8_t* ws = thread_workspace(std::max<size_t>(plan->workspace, 64));
  std::vector<uint8_t*> ptrs(values_.size(), nullptr);
  for (size_t v = 0; v < values_.size(); ++v) ptrs[v] = ws + plan->offsets[v];
  static const bool profile = std::getenv("QPACK_GRAPH_PROFILE") != nullptr;
  auto since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  auto t_edges = std::chrono::steady_clock::now();
  for (int i = 0; i < num_inputs; ++i) {
    const int v = inputs_[i];
    if (plan->external[v]) {
      ptrs[v] = static_cast<uint8_t*>(inputs[i].data);
      continue;
    }
    const Shape& s = plan->shapes[v];  // NCHW -> NHWC
    transpose_channels(static_cast<const uint8_t*>(inputs[i].data), s.d[0], s.d[1], s.d[2] * s.d[3],
                       elem_size(values_[v].dtype), ptrs[v]);
  }
  // A node's output that the caller wants in the layout it has is written
  // straight into the caller's buffer.
  std::vector<bool> written(static_cast<size_t>(num_outputs), false);
  for (int i = 0; i < num_outputs; ++i) {
    const int v = outputs_[i];
    const bool produced = std::find(inputs_.begin(), inputs_.end(), v) == inputs_.end();
    const bool once = std::count(outputs_.begin(), outputs_.end(), v) == 1;
    const qpack_layout held = plan->nchw[v] ? QPACK_LAYOUT_NCHW : QPACK_LAYOUT_NHWC;
    if (produced && once && !plan->nlc[v] && (plan->shapes[v].rank != 4 || outputs[i].layout == held) &&
        plan->shapes[v].numel() > 0) {
      ptrs[v] = static_cast<uint8_t*>(outputs[i].data);
      written[i] = true;
    }
  }
  if (profile) std::fprintf(stderr, "qpack graph inputs to their layouts %.1f us\n", since(t_edges));
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].kind == QPACK_NODE_ADD && plan->fused_add[i] >= 0) continue;  // in its convolution
    if (!profile) {
      run_node(nodes_[i], *plan, ptrs.data());
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    run_node(nodes_[i], *plan, ptrs.data());
    const double us = since(t0);
    const Shape& s = plan->shapes[nodes_[i].out];
    std::fprintf(stderr, "qpack graph node %zu %s%s %s%s %.1f us\n", i, kind_name(nodes_[i].kind),
                 plan->fused_add[i] >= 0 ? "+add" : "", shape_str(s).c_str(),
                 plan->on_backend[i] ? (std::string(" on ") + backend(backend_).name).c_str() : "", us);
  }
  t_edges = std::chrono::steady_clock::now();
  for (int i = 0; i < num_outputs; ++i) {
    if (written[i]) continue;
    const int v = outputs_[i];
    const Shape& s = plan->shapes[v];
    const size_t es = elem_size(values_[v].dtype);
    // held NHWC, or NCHW where it is a graph input read in place (plan->nchw)
    const qpack_layout held = plan->nchw[v] ? QPACK_LAYOUT_NCHW : QPACK_LAYOUT_NHWC;
    if (plan->nlc[v]) {  // [N, L, C] -> [N, C, L]
      transpose_channels(ptrs[v], s.d[0], s.d[2], s.d[1], es, static_cast<uint8_t*>(outputs[i].data));
    } else if (s.rank == 4 && outputs[i].layout != held) {  // [N, rows, cols] -> [N, cols, rows]
      const bool nhwc = held == QPACK_LAYOUT_NHWC;
      const int64_t hw = s.d[2] * s.d[3], c = s.d[1];
      transpose_channels(ptrs[v], s.d[0], nhwc ? hw : c, nhwc ? c : hw, es, static_cast<uint8_t*>(outputs[i].data));
    } else if (s.numel() > 0) {
      std::memcpy(outputs[i].data, ptrs[v], static_cast<size_t>(s.numel()) * es);
    }
  }
  if (profile) std::fprintf(stderr, "qpack graph outputs to the caller's layouts %.1f us\n", since(t_edges));
}

namespace {

// Per-channel sums over `rows` rows of C values (stride C), blocks of 64 rows
// accumulated in a float / int32 vector (which vectorizes), added into s in
// double: sum of x (sq = false) or of (x - m[c])^2 (sq = true; f32) / of
// (q - zp) or (q - zp)^2 (u8).
template <typename T>
void channel_sums(const T* x, int64_t rows, int64_t C, const float* m, int32_t zp, bool sq, double* s) {
  using Acc = std::conditional_t<std::is_same<T, float>::value, float, int32_t>;
  std::vector<Acc> acc(static_cast<size_t>(C));
  Acc* __restrict a = acc.data();
  for (int64_t r0 = 0; r0 < rows; r0 += 64) {
    std::fill(acc.begin(), acc.end(), Acc(0));
    for (int64_t r = r0; r < std::min(rows, r0 + 64); ++r) {
      const T* __restrict p = x + r * C;
      if constexpr (std::is_same<T, float>::value) {
        if (sq) {
          for (int64_t c = 0; c < C; ++c) a[c] += (p[c] - m[c]) * (p[c] - m[c]);
        } else {
          for (int64_t c = 0; c < C; ++c) a[c] += p[c];
        }
      } else if (sq) {
        for (int64_t c = 0; c < C; ++c) a[c] += (int32_t(p[c]) - zp) * (int32_t(p[c]) - zp);
      } else {
        for (int64_t c = 0; c < C; ++c) a[c] += int32_t(p[c]) - zp;
      }
    }
    for (int64_t c = 0; c < C; ++c) s[c] += static_cast<double>(a[c]);
  }
}

// GroupNorm (a LAYER_NORM node with kernel_h = 0): each sample's channels in
// kernel_w groups, each group normalized over its channels and every spatial
// position, (x - mean) / sqrt(var + eps) * scale[c] + shift[c], var biased.
// The stored value is samples of rows x C x inner (split_channels: NHWC
// pixels' channels, or [N, C, L]). Per sample: per-channel sums (u8: exact
// integer sums of x - zero point and of its square; f32: in double, then the
// squares of x - the group's mean, a second pass), the groups' statistics,
// then one per-channel affine: y = x a[c] + b[c] (u8: affine_u8, requantized).
void group_norm(const Shape& xs, const GraphNode& n, bool u8, const Q& qx, const Q& qy, const uint8_t* x,
                uint8_t* y) {
  int64_t outer, C, inner;
  split_channels(xs, &outer, &C, &inner);
  const int64_t G = n.kernel[1], Cg = C / G, N = xs.d[0], rows = outer / std::max<int64_t>(N, 1);
  const int64_t per_sample = rows * C * inner;
  const double count = static_cast<double>(rows * Cg * inner);
  auto* xf = reinterpret_cast<const float*>(x);
  auto* yf = reinterpret_cast<float*>(y);
  parallel_range(N, 1, [&](int64_t b, int64_t e) {
    std::vector<double> s1(static_cast<size_t>(C)), s2(static_cast<size_t>(C)), mean(static_cast<size_t>(G)),
        var(static_cast<size_t>(G));
    std::vector<float> a(static_cast<size_t>(C)), sh(static_cast<size_t>(C)), mc(static_cast<size_t>(C));
    auto sums = [&](int64_t base, bool sq) {  // per-channel sums of the sample into s1 / s2
      double* s = sq ? s2.data() : s1.data();
      std::fill(s, s + C, 0.0);
      if (inner == 1) {
        if (u8) {
          channel_sums(x + base, rows, C, nullptr, qx.zp, sq, s);
        } else {
          channel_sums(xf + base, rows, C, mc.data(), 0, sq, s);
        }
        return;
      }
      for (int64_t r = 0; r < rows; ++r) {  // [N, C, L]: each channel's run of `inner` values
        for (int64_t c = 0; c < C; ++c) {
          const int64_t k0 = base + (r * C + c) * inner;
          double t = 0.0;
          for (int64_t i = 0; i < inner; ++i) {
            const double v = u8 ? static_cast<double>(int32_t(x[k0 + i]) - qx.zp) : xf[k0 + i] - mc[c];
            t += sq ? v * v : v;
          }
          s[c] += t;
        }
      }
    };
    auto group_total = [&](const std::vector<double>& s, int64_t g) {
      double t = 0.0;
      for (int64_t c = g * Cg; c < (g + 1) * Cg; ++c) t += s[c];
      return t;
    };
    for (int64_t smp = b; smp < e; ++smp) {
      const int64_t base = smp * per_sample;
      std::fill(mc.begin(), mc.end(), 0.0f);
      sums(base, false);
      for (int64_t g = 0; g < G; ++g) mean[g] = group_total(s1, g) / count;  // (u8: in quanta, exact sums)
      if (u8) {  // var from the exact integer sums: E[v^2] - E[v]^2, in quanta
        sums(base, true);
        for (int64_t g = 0; g < G; ++g) {
          var[g] = std::max(0.0, group_total(s2, g) / count - mean[g] * mean[g]) * qx.scale * qx.scale;
          mean[g] *= qx.scale;
        }
      } else {  // the squares of x - the group's mean: a second pass, no cancellation
        for (int64_t c = 0; c < C; ++c) mc[c] = static_cast<float>(mean[c / Cg]);
        sums(base, true);
        for (int64_t g = 0; g < G; ++g) var[g] = group_total(s2, g) / count;
      }
      // y = (x - mean) inv w[c] + shift[c] = x a[c] + sh[c]
      for (int64_t c = 0; c < C; ++c) {
        const int64_t g = c / Cg;
        const double ac = n.affine_scale[c] / std::sqrt(var[g] + static_cast<double>(n.act_min));
        if (u8) {  // in quanta: ((q - zx) sx a + shift - mean a) / sy
          a[c] = static_cast<float>(ac * qx.scale / qy.scale);
          sh[c] = static_cast<float>((n.affine_shift[c] - mean[g] * ac) / qy.scale);
        } else {
          a[c] = static_cast<float>(ac);
          sh[c] = static_cast<float>(n.affine_shift[c] - mean[g] * ac);
        }
      }
      if (u8) {
        affine_u8(x + base, rows, C, inner, a.data(), sh.data(), static_cast<float>(qx.zp),
                  static_cast<float>(qy.zp), y + base);
        continue;
      }
      const float* __restrict ap = a.data();
      const float* __restrict bp = sh.data();
      for (int64_t r = 0; r < rows; ++r) {
        if (inner == 1) {
          const float* __restrict p = xf + base + r * C;
          float* __restrict q = yf + base + r * C;
          for (int64_t c = 0; c < C; ++c) q[c] = p[c] * ap[c] + bp[c];
          continue;
        }
        for (int64_t c = 0; c < C; ++c) {
          const int64_t k0 = base + (r * C + c) * inner;
          for (int64_t i = 0; i < inner; ++i) yf[k0 + i] = xf[k0 + i] * ap[c] + bp[c];
        }
      }
    }
  });
}

}  // namespace

// The attention node: f32 heads read where they are (strided rows of their
// values); u8 inputs dequantized first (each distinct value once, a packed
// qkv projection's once for q, k and v) and the f32 output quantized after.
void Graph::run_attention(const GraphNode& n, const GraphPlan& plan, uint8_t* const* ptrs) const {
  const Shape& ys = plan.shapes[n.out];
  const GraphValue& yv = values_[n.out];
  const bool u8 = yv.dtype == QPACK_DTYPE_U8;
  const float* src[3];
  float* out = reinterpret_cast<float*>(ptrs[n.out]);
  thread_local std::vector<float> scratch;
  if (u8) {
    size_t off[3], total = static_cast<size_t>(ys.numel());  // the f32 output first
    int first[3];  // the first of q, k, v read from the same value
    for (int a = 0; a < 3; ++a) {
      first[a] = a;
      for (int j = 0; j < a; ++j) {
        if (n.in[j] == n.in[a]) {
          first[a] = j;
          break;
        }
      }
      off[a] = first[a] < a ? off[first[a]] : total;
      if (first[a] == a) total += static_cast<size_t>(plan.shapes[n.in[a]].numel());
    }
    scratch.resize(total);
    for (int a = 0; a < 3; ++a) {
      src[a] = scratch.data() + off[a];
      if (first[a] < a) continue;
      load_f32_parallel(ptrs[n.in[a]], plan.shapes[n.in[a]].numel(),
                        Q{values_[n.in[a]].scale, values_[n.in[a]].zero_point}, scratch.data() + off[a]);
    }
    out = scratch.data();
  } else {
    for (int a = 0; a < 3; ++a) src[a] = reinterpret_cast<const float*>(ptrs[n.in[a]]);
  }
  const Shape& qs = plan.shapes[n.in[0]];
  const Shape& ks = plan.shapes[n.in[1]];
  const Shape& vs = plan.shapes[n.in[2]];
  AttentionF32 a;
  a.B = qs.d[0];
  a.H = n.kernel[0];
  a.L = qs.d[1];
  a.S = ks.d[1];
  a.D = n.kernel[1];
  a.Dv = n.stride[0];
  a.q = src[0] + n.pad[0];
  a.k = src[1] + n.pad[1];
  a.v = src[2] + n.pad[2];
  a.out = out;
  const int64_t hs = attention_qk_stride(n), hv = attention_v_stride(n);
  const bool mq = attention_multi_query(n);  // every q head reads k's and v's one head
  const int64_t q_strides[3] = {a.L * qs.d[2], hs, qs.d[2]}, k_strides[3] = {a.S * ks.d[2], mq ? 0 : hs, ks.d[2]},
                v_strides[3] = {a.S * vs.d[2], mq ? 0 : hv, vs.d[2]}, o_strides[3] = {a.L * ys.d[2], a.Dv, ys.d[2]};
  std::copy(q_strides, q_strides + 3, a.q_stride);
  std::copy(k_strides, k_strides + 3, a.k_stride);
  std::copy(v_strides, v_strides + 3, a.v_stride);
  std::copy(o_strides, o_strides + 3, a.out_stride);
  a.scale = n.act_min;
  a.causal = n.ceil_mode;
  if (!n.affine_scale.empty()) {  // [L][S] for every head, [H][L][S], [G][H][L][S] by batch % G,
                                  // or [H][L][S] then [G][L][S] (act_max = G windows)
    const int64_t masks = static_cast<int64_t>(n.affine_scale.size()), LS = a.L * a.S;
    a.mask = n.affine_scale.data();
    a.mask_stride[1] = masks == LS ? 0 : LS;
    a.mask_stride[2] = a.S;
    const int64_t windows = attention_windows(n);
    if (windows > 0) {  // [H][L][S] for the heads, then [G][L][S] by batch % G
      a.window_mask = a.mask + a.H * LS;
      a.window_groups = windows;
    } else if (masks > a.H * LS) {
      a.mask_groups = masks / (a.H * LS);
      a.mask_stride[0] = a.H * LS;
    }
  }
  attention_f32(a);
  if (u8) quantize_u8_array(out, ys.numel(), QParams{yv.scale, yv.zero_point}, ptrs[n.out]);
}

void Graph::run_node(const GraphNode& n, const GraphPlan& plan, uint8_t* const* ptrs) const {
  const Shape& xs = plan.shapes[n.in[0]];
  const Shape& ys = plan.shapes[n.out];
  const GraphValue& xv = values_[n.in[0]];
  const GraphValue& yv = values_[n.out];
  const bool u8 = xv.dtype == QPACK_DTYPE_U8;
  const uint8_t* x = ptrs[n.in[0]];
  uint8_t* y = ptrs[n.out];
  const Q qx{xv.scale, xv.zero_point}, qy{yv.scale, yv.zero_point};
  const int64_t count = ys.numel();
  auto* xf = reinterpret_cast<const float*>(x);
  auto* yf = reinterpret_cast<float*>(y);
  if (count == 0) return;
  if (plan.on_backend[static_cast<size_t>(&n - nodes_.data())]) {  // the backend's own operator
    n.backend_op->run(xs, ys, x, n.in.size() > 1 ? ptrs[n.in[1]] : nullptr, y);
    return;
  }

  switch (n.kind) {
    case QPACK_NODE_CONV2D: {
      // the shape fuse_adds asked the kernel about, with the add it planned
      const ConvShape s = conv_shape(n, plan, plan.fused_add[static_cast<size_t>(&n - nodes_.data())]);
      if (u8) {
        n.conv->kernel().run_u8(s, x, qx.scale, qx.zp, y);
      } else {
        n.conv->kernel().run_f32(s, xf, yf);
      }
      return;
    }
    case QPACK_NODE_LINEAR: {
      const int64_t M = xs.numel() / xs.d[n.ceil_mode ? 1 : xs.rank - 1];  // per pixel: N H W rows
      if (u8) {
        n.linear->kernel().run_u8(M, x, qx.scale, qx.zp, y);
      } else if (n.act == QPACK_ACT_NONE ||
                 !n.linear->kernel().run_f32_fused(M, xf, yf, n.act, n.act_min, n.act_max)) {
        n.linear->kernel().run_f32(M, xf, yf);
        if (n.act != QPACK_ACT_NONE) {  // not fused by the backend: on the output, right after
          parallel_range(count, kGrain, [&](int64_t b, int64_t e) {
            activate_f32(n.act, n.act_min, n.act_max, yf + b, e - b, yf + b);
          });
        }
      }
      return;
    }
    case QPACK_NODE_ADD: {
      const uint8_t* x1 = ptrs[n.in[1]];
      const GraphValue& v1 = values_[n.in[1]];
      const Q q1{v1.scale, v1.zero_point};
      const auto act = n.act;
      const float lo = n.act_min, hi = n.act_max;
      if (u8 && (act == QPACK_ACT_NONE || act == QPACK_ACT_RELU || act == QPACK_ACT_CLAMP)) {
        uint8_t qlo = 0, qhi = 255;  // the activation is a clamp: in the u8 domain
        if (act != QPACK_ACT_NONE) {
          output_bounds_u8(act == QPACK_ACT_RELU ? 0.0f : lo,
                           act == QPACK_ACT_RELU ? std::numeric_limits<float>::infinity() : hi,
                           qy.scale, qy.zp, &qlo, &qhi);
        }
        add_u8(x, QParams{qx.scale, qx.zp}, x1, QParams{q1.scale, q1.zp}, count,
               QParams{qy.scale, qy.zp}, qlo, qhi, y);
        return;
      }
      parallel_range(count, kGrain, [&](int64_t b, int64_t e) {
        if (u8) {  // (GELU, SiLU...) in float chunks: the sums, the activation's vector code, quantized
          thread_local std::vector<float> s0, s1;
          constexpr int64_t kChunk = 4096;
          s0.resize(kChunk);
          s1.resize(kChunk);
          for (int64_t c0 = b; c0 < e; c0 += kChunk) {
            const int64_t len = std::min(kChunk, e - c0);
            load_f32(x + c0, len, qx, s0.data());
            load_f32(x1 + c0, len, q1, s1.data());
            for (int64_t i = 0; i < len; ++i) s0[i] += s1[i];
            activate_f32(act, lo, hi, s0.data(), len, s0.data());
            const float inv = 1.0f / qy.scale;
            for (int64_t i = 0; i < len; ++i) s0[i] *= inv;
            store_u8(s0.data(), len, static_cast<float>(qy.zp), y + c0);
          }
        } else {
          const float* a = xf;
          const float* c = reinterpret_cast<const float*>(x1);
          if (act == QPACK_ACT_NONE) {
            for (int64_t i = b; i < e; ++i) yf[i] = a[i] + c[i];
          } else if (act == QPACK_ACT_RELU) {
            for (int64_t i = b; i < e; ++i) yf[i] = std::max(a[i] + c[i], 0.0f);
          } else {  // the sum, then the activation's vector code over it (GELU's erf, SiLU's exp)
            for (int64_t i = b; i < e; ++i) yf[i] = a[i] + c[i];
            activate_f32(act, lo, hi, yf + b, e - b, yf + b);
          }
        }
      });
      return;
    }
    case QPACK_NODE_MUL: {
      // `big` is the full-size operand, `small` the other: equal shapes (one
      // pass), or [N, C, 1, 1] scaling each pixel's C channels.
      int a = n.in[0], b = n.in[1];
      if (plan.shapes[a].numel() < plan.shapes[b].numel()) std::swap(a, b);
      const uint8_t* big = ptrs[a];
      const uint8_t* small = ptrs[b];
      const Q qa{values_[a].scale, values_[a].zero_point}, qb{values_[b].scale, values_[b].zero_point};
      const auto* bigf = reinterpret_cast<const float*>(big);
      const auto* smallf = reinterpret_cast<const float*>(small);
      const bool per_channel = !(plan.shapes[a] == plan.shapes[b]);
      const Shape& bs = plan.shapes[a];
      const int64_t C = per_channel ? bs.d[1] : count, HW = per_channel ? bs.d[2] * bs.d[3] : 1;
      const int64_t rows = per_channel ? bs.d[0] * HW : 1;
      if (u8) {
        // (a - za) (b - zb) sa sb / sy rounded half-even, + zy, clamped: qy.quant of the product
        const float k = qa.scale * qb.scale / qy.scale, zy = static_cast<float>(qy.zp);
        const float za = static_cast<float>(qa.zp), zb = static_cast<float>(qb.zp);
        if (!per_channel) {
          parallel_range(count, kGrain, [&](int64_t lo, int64_t hi) {
            if (mul_u8_vector(big + lo, small + lo, hi - lo, za, zb, k, zy, y + lo)) return;
            for (int64_t i = lo; i < hi; ++i) {
              y[i] = round_u8((static_cast<float>(big[i]) - za) * (static_cast<float>(small[i]) - zb) * k, zy);
            }
          });
          return;
        }
        // per image: (a - za) m[c] with m[c] = (b[c] - zb) k, the affine node's loop
        parallel_range(rows, std::max<int64_t>(1, kGrain / C), [&](int64_t lo, int64_t hi) {
          thread_local std::vector<float> m;
          m.resize(static_cast<size_t>(C));
          for (int64_t r = lo; r < hi;) {
            const int64_t image = r / HW, end = std::min(hi, (image + 1) * HW);
            for (int64_t c = 0; c < C; ++c) m[c] = (static_cast<float>(small[image * C + c]) - zb) * k;
            affine_u8(big + r * C, end - r, C, 1, m.data(), nullptr, za, zy, y + r * C);
            r = end;
          }
        });
        return;
      }
      parallel_range(rows, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t base = r * C, sbase = per_channel ? (r / HW) * C : base;
          for (int64_t c = 0; c < C; ++c) yf[base + c] = bigf[base + c] * smallf[sbase + c];
        }
      });
      return;
    }
    case QPACK_NODE_MAXPOOL2D:
      if (u8) {
        max_pool(x, xs, ys, n, y);
      } else {
        max_pool(xf, xs, ys, n, yf);
      }
      return;
    case QPACK_NODE_AVGPOOL2D:
      if (u8) {
        avg_pool(x, qx, xs, ys, n, [&](float v) { return qy.quant(v); }, y);
      } else {
        avg_pool(xf, Q{1.0f, 0}, xs, ys, n, [](float v) { return v; }, yf);
      }
      return;
    case QPACK_NODE_GLOBAL_AVGPOOL: {
      if (xs.rank == 3) {  // row-major [N, C, L]: each (n, c) row's mean
        const int64_t rows = xs.d[0] * xs.d[1], L = xs.d[2];
        const float inv = 1.0f / static_cast<float>(std::max<int64_t>(L, 1));
        parallel_range(rows, 64, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            float acc = 0.0f;
            for (int64_t l = 0; l < L; ++l) acc += u8 ? static_cast<float>(x[r * L + l]) : xf[r * L + l];
            if (u8) {
              y[r] = qy.quant((acc * inv - qx.zp) * qx.scale);
            } else {
              yf[r] = acc * inv;
            }
          }
        });
        return;
      }
      const int64_t N = xs.d[0], C = xs.d[1], HW = xs.d[2] * xs.d[3];
      parallel_range(N, 1, [&](int64_t b, int64_t e) {
        std::vector<float> acc(static_cast<size_t>(C));
        for (int64_t img = b; img < e; ++img) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t p = 0; p < HW; ++p) {
            if (u8) {
              sum_into(acc.data(), x + (img * HW + p) * C, C);
            } else {
              sum_into(acc.data(), xf + (img * HW + p) * C, C);
            }
          }
          const float inv = 1.0f / static_cast<float>(std::max<int64_t>(HW, 1));
          for (int64_t c = 0; c < C; ++c) {
            if (u8) {
              y[img * C + c] = qy.quant((acc[c] * inv - qx.zp) * qx.scale);
            } else {
              yf[img * C + c] = acc[c] * inv;
            }
          }
        }
      });
      return;
    }
    case QPACK_NODE_DEPTH_TO_SPACE: {
      // y[:, c, i kh + a, j kw + b] = x[:, (a kw + b) C + c, i, j] on NHWC values (the plan holds a
      // depth_to_space's input and output so: neither is an input read in place nor a planar
      // convolution's output): each output pixel's C values are one run of the input pixel's;
      // in pixel_shuffle's order (ceil_mode) x[:, c kh kw + a kw + b, i, j], every kh kw-th value
      const size_t es = elem_size(xv.dtype);
      const int64_t H = xs.d[2], W = xs.d[3], CI = xs.d[1], kh = n.kernel[0], kw = n.kernel[1];
      const int64_t C = ys.d[1], OH = ys.d[2], OW = ys.d[3];
      parallel_range(ys.d[0] * OH, std::max<int64_t>(1, kGrain / std::max<int64_t>(OW * C, 1)),
                     [&](int64_t b0, int64_t e0) {
        for (int64_t r = b0; r < e0; ++r) {
          const int64_t img = r / OH, oy = r % OH, i = oy / kh, a = oy % kh;
          for (int64_t ox = 0; ox < OW; ++ox) {
            uint8_t* dst = y + static_cast<size_t>(((img * OH + oy) * OW + ox) * C) * es;
            const uint8_t* pixel = x + static_cast<size_t>(((img * H + i) * W + ox / kw) * CI) * es;
            if (!n.ceil_mode) {
              std::memcpy(dst, pixel + static_cast<size_t>((a * kw + ox % kw) * C) * es, static_cast<size_t>(C) * es);
            } else if (es == 4) {
              const float* s = reinterpret_cast<const float*>(pixel) + a * kw + ox % kw;
              float* d = reinterpret_cast<float*>(dst);
              for (int64_t c = 0; c < C; ++c) d[c] = s[c * kh * kw];
            } else {
              const uint8_t* s = pixel + a * kw + ox % kw;
              for (int64_t c = 0; c < C; ++c) dst[c] = s[c * kh * kw];
            }
          }
        }
      });
      return;
    }
    case QPACK_NODE_ATTENTION:
      run_attention(n, plan, ptrs);
      return;
    case QPACK_NODE_TRANSPOSE: {
      // Each value's bytes as held, [N][A][B] or [N][B][A]: a rank-3 value [N, A, B] row-major or
      // channels-last (plan.nlc); an image [N, C, H, W] and its tokens [N, H W, C] positions by
      // channels (NHWC, rows: A = H W, B = C) or channels by positions (NCHW, channels-last
      // rank 3). The same order in and out is a copy, else one tiled transpose.
      int64_t A, B;
      bool x_ab, y_ab;
      if (xs.rank == 3 && ys.rank == 3) {
        A = xs.d[1];
        B = xs.d[2];
        x_ab = !plan.nlc[n.in[0]];
        y_ab = plan.nlc[n.out];  // out [N, B, A] held as [N, A, B]
      } else {
        const Shape& img = xs.rank == 4 ? xs : ys;
        A = img.d[2] * img.d[3];
        B = img.d[1];
        x_ab = xs.rank == 4 ? !plan.nchw[n.in[0]] : !plan.nlc[n.in[0]];
        y_ab = ys.rank == 4 ? !plan.nchw[n.out] : !plan.nlc[n.out];
      }
      const size_t es = elem_size(xv.dtype);
      if (x_ab == y_ab) {
        std::memcpy(y, x, static_cast<size_t>(count) * es);
      } else if (x_ab) {
        transpose_channels(x, xs.d[0], A, B, es, y);
      } else {
        transpose_channels(x, xs.d[0], B, A, es, y);
      }
      return;
    }
    case QPACK_NODE_FLATTEN: {
      const size_t es = elem_size(xv.dtype);
      if (xs.rank == 4 && xs.d[2] * xs.d[3] > 1) {  // NHWC -> NCHW order
        transpose_channels(x, xs.d[0], xs.d[2] * xs.d[3], xs.d[1], es, y);
      } else {
        std::memcpy(y, x, static_cast<size_t>(count) * es);
      }
      return;
    }
    case QPACK_NODE_PAD: {  // NHWC rows: the border's pixels filled, each inner row's W C values copied
      // (u8 of other qparams: requantized as one channel of W C values, affine_u8)
      const size_t es = elem_size(xv.dtype);
      const int64_t H = xs.d[2], W = xs.d[3], C = xs.d[1], OH = ys.d[2], OW = ys.d[3];
      const int64_t pt = n.pad[0], pl = n.pad[1];
      const uint8_t border_u8 = u8 ? qy.quant(n.act_min) : 0;
      const bool requant = u8 && !(xv.scale == yv.scale && xv.zero_point == yv.zero_point);
      const float m = qx.scale / qy.scale, zi = static_cast<float>(qx.zp), zy = static_cast<float>(qy.zp);
      auto fill = [&](uint8_t* dst, int64_t count) {
        if (u8) {
          std::memset(dst, border_u8, static_cast<size_t>(count));
        } else {
          std::fill_n(reinterpret_cast<float*>(dst), count, n.act_min);
        }
      };
      parallel_range(ys.d[0] * OH, std::max<int64_t>(1, kGrain / std::max<int64_t>(OW * C, 1)),
                     [&](int64_t b0, int64_t e0) {
        for (int64_t r = b0; r < e0; ++r) {
          const int64_t img = r / OH, oy = r % OH, iy = oy - pt;
          uint8_t* dst = y + static_cast<size_t>(r * OW * C) * es;
          if (iy < 0 || iy >= H) {
            fill(dst, OW * C);
            continue;
          }
          fill(dst, pl * C);
          const uint8_t* src = x + static_cast<size_t>(((img * H + iy) * W) * C) * es;
          if (requant) {
            affine_u8(src, 1, 1, W * C, &m, nullptr, zi, zy, dst + pl * C);
          } else {
            std::memcpy(dst + static_cast<size_t>(pl * C) * es, src, static_cast<size_t>(W * C) * es);
          }
          fill(dst + static_cast<size_t>((pl + W) * C) * es, (OW - pl - W) * C);
        }
      });
      return;
    }
    case QPACK_NODE_PERMUTE_ROWS: {  // rows of C values (NHWC pixels, row-major rows) copied in table order
      const size_t es = elem_size(xv.dtype);
      const int64_t C = xs.rank == 4 ? xs.d[1] : xs.d[2];
      const int64_t R = static_cast<int64_t>(n.rows.size()), T = count / C;
      const size_t row = static_cast<size_t>(C) * es;
      const int32_t* p = n.rows.data();
      parallel_range(T, std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1)), [&](int64_t b0, int64_t e0) {
        for (int64_t r = b0; r < e0; ++r) {
          const int64_t block = r - r % R;
          std::memcpy(y + static_cast<size_t>(r) * row, x + static_cast<size_t>(block + p[r % R]) * row, row);
        }
      });
      return;
    }
    case QPACK_NODE_CONSTANT: {  // each sample a copy of the table (its u8 bytes, quantized once)
      const size_t es = elem_size(yv.dtype);
      const size_t bytes = n.affine_scale.size() * es;
      const uint8_t* table = yv.dtype == QPACK_DTYPE_U8 ? n.lut.data()
                                                          : reinterpret_cast<const uint8_t*>(n.affine_scale.data());
      for (int64_t s = 0; s < ys.d[0]; ++s) std::memcpy(y + static_cast<size_t>(s) * bytes, table, bytes);
      return;
    }
    case QPACK_NODE_CONCAT: {
      int64_t outer, channels, inner;
      split_channels(ys, &outer, &channels, &inner);
      const size_t es = elem_size(yv.dtype);
      struct Part {
        const uint8_t* src;
        int64_t run;  // values per outer step
        bool requant;
        float m, zi;
      };
      std::vector<Part> parts;
      for (int v : n.in) {
        int64_t o2, c2, i2;
        split_channels(plan.shapes[v], &o2, &c2, &i2);
        const GraphValue& iv = values_[v];
        parts.push_back(Part{ptrs[v], c2 * inner, u8 && !(iv.scale == yv.scale && iv.zero_point == yv.zero_point),
                             iv.scale / qy.scale, static_cast<float>(iv.zero_point)});
      }
      const float zy = static_cast<float>(qy.zp);
      const bool stream = static_cast<size_t>(ys.numel()) * es > (size_t(8) << 20);
      // output step by step, each input's run copied (or requantized as one channel of run
      // values: affine_u8) after the one before: the output is written once, in order (an
      // input at a time wrote each NHWC pixel's cache lines once per input: 1923 -> 1360 us
      // for the [1, 96, 256, 256] f32 concat above)
      parallel_range(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels * inner, 1)),
                     [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          uint8_t* dst = y + static_cast<size_t>(o * channels * inner) * es;
          for (const Part& p : parts) {
            const uint8_t* src = p.src + static_cast<size_t>(o * p.run) * es;
            if (!p.requant) {
              copy_run(dst, src, static_cast<size_t>(p.run) * es, stream);
            } else {
              affine_u8(src, 1, 1, p.run, &p.m, nullptr, p.zi, zy, dst);
            }
            dst += static_cast<size_t>(p.run) * es;
          }
        }
#ifdef __SSE2__
        if (stream) _mm_sfence();
#endif
      });
      return;
    }
    case QPACK_NODE_RESIZE_NEAREST:
    case QPACK_NODE_RESIZE_BILINEAR: {
      const bool bilinear = n.kind == QPACK_NODE_RESIZE_BILINEAR;
      const Taps th = resize_taps(bilinear, n.ceil_mode, xs.d[2], ys.d[2], n.act_min);
      const Taps tw = resize_taps(bilinear, n.ceil_mode, xs.d[3], ys.d[3], n.act_max);
      if (!bilinear && u8) {
        resize_nearest(x, xs, ys, th, tw, y);
      } else if (!bilinear) {
        resize_nearest(xf, xs, ys, th, tw, yf);
      } else if (u8) {  // (x - zx) sx / sy interpolated, rounded as the other u8 nodes
        const float zy = static_cast<float>(qy.zp);
        resize_bilinear(x, Q{qx.scale / qy.scale, qx.zp}, xs, ys, th, tw,
                        [zy](float h0, const float* a, float h1, const float* b, int64_t n, uint8_t* o) {
                          thread_local std::vector<float> row;
                          row.resize(static_cast<size_t>(n));
                          for (int64_t k = 0; k < n; ++k) row[k] = h0 * a[k] + h1 * b[k];
                          store_u8(row.data(), n, zy, o);
                        }, y);
      } else {
        resize_bilinear(xf, Q{1.0f, 0}, xs, ys, th, tw,
                        [](float h0, const float* __restrict a, float h1, const float* __restrict b, int64_t n,
                           float* __restrict o) {
                          for (int64_t k = 0; k < n; ++k) o[k] = h0 * a[k] + h1 * b[k];
                        }, yf);
      }
      return;
    }
    case QPACK_NODE_LAYER_NORM: {
      if (n.kernel[0] == 0) {
        group_norm(xs, n, u8, qx, qy, x, y);
        return;
      }
      // The stored value as outer x C x inner, C the normalized dim: NHWC
      // pixels' channels and rows of a last dim are contiguous (inner = 1);
      // a rank-4 value's W is strided by its channels (inner = C).
      const int64_t C = static_cast<int64_t>(n.affine_scale.size());
      const int64_t inner = (xs.rank == 4 && n.kernel[0] == -1) ? xs.d[1] : 1;
      const int64_t rows = count / C;  // rows of the normalized dim, each at stride inner
      const float* w = n.affine_scale.data();
      const float* sh = n.affine_shift.data();
      if (!u8 && inner == 1) {
        parallel_range(rows, std::max<int64_t>(1, kGrain / C), [&](int64_t b, int64_t e) {
          layer_norm_rows(xf + b * C, e - b, C, w, sh, n.act_min, yf + b * C);
        });
        return;
      }
      if (!u8) {  // W of NHWC [N*H][W][C]: each block's C columns at once, rows of C contiguous
        parallel_range(rows / inner, std::max<int64_t>(1, kGrain / (C * inner)), [&](int64_t b, int64_t e) {
          thread_local std::vector<float> mean, inv;
          mean.resize(static_cast<size_t>(inner));
          inv.resize(static_cast<size_t>(inner));
          for (int64_t o = b; o < e; ++o) {
            layer_norm_columns(xf + o * C * inner, C, inner, w, sh, n.act_min, mean.data(), inv.data(),
                               yf + o * C * inner);
          }
        });
        return;
      }
      // u8: dequantized, normalized with scale and shift over qy.scale, requantized
      std::vector<float> wq(w, w + C), bq(sh, sh + C);
      for (int64_t c = 0; c < C; ++c) {
        wq[c] /= qy.scale;
        bq[c] /= qy.scale;
      }
      const float zy = static_cast<float>(qy.zp);
      if (inner == 1) {  // u8 rows, contiguous: blocks of rows dequantized, normalized, requantized
        const int64_t block = std::max<int64_t>(1, 16384 / C);
        parallel_range(rows, std::max<int64_t>(1, kGrain / C), [&](int64_t b, int64_t e) {
          thread_local std::vector<float> buf;
          buf.resize(static_cast<size_t>(std::min(block, e - b) * C));
          for (int64_t r0 = b; r0 < e; r0 += block) {
            const int64_t n_el = (std::min(e, r0 + block) - r0) * C;
            const uint8_t* xb = x + r0 * C;
            load_f32(xb, n_el, qx, buf.data());
            layer_norm_rows(buf.data(), n_el / C, C, wq.data(), bq.data(), n.act_min, buf.data());
            store_u8(buf.data(), n_el, zy, y + r0 * C);
          }
        });
        return;
      }
      parallel_range(rows, std::max<int64_t>(1, kGrain / C), [&](int64_t b, int64_t e) {
        thread_local std::vector<float> row;  // u8 rows at stride inner: gathered, written back
        thread_local std::vector<uint8_t> bytes;
        row.resize(static_cast<size_t>(C));
        bytes.resize(static_cast<size_t>(C));
        for (int64_t r = b; r < e; ++r) {
          const int64_t base = (r / inner) * C * inner + r % inner;  // element 0 of row r
          for (int64_t c = 0; c < C; ++c) row[c] = qx.deq(x[base + c * inner]);
          layer_norm_rows(row.data(), 1, C, wq.data(), bq.data(), n.act_min, row.data());
          store_u8(row.data(), C, zy, bytes.data());
          for (int64_t c = 0; c < C; ++c) y[base + c * inner] = bytes[c];
        }
      });
      return;
    }
    case QPACK_NODE_PRELU: {
      int64_t outer, channels, inner;
      split_channels(xs, &outer, &channels, &inner);
      // f32: x > 0 ? x : a[c] x; u8: (x - zx) times sx / sy or a[c] sx / sy, rounded as the other u8 nodes
      std::vector<float> a(static_cast<size_t>(channels));
      for (size_t c = 0; c < a.size(); ++c) {
        a[c] = n.affine_scale[n.affine_scale.size() == 1 ? 0 : c] * (u8 ? qx.scale / qy.scale : 1.0f);
      }
      const float pos = u8 ? qx.scale / qy.scale : 1.0f;
      const float zx = static_cast<float>(qx.zp), zy = static_cast<float>(qy.zp);
      parallel_range(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels * inner, 1)),
                     [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          if (inner == 1) {  // NHWC: a pixel's channels, one vector loop
            const int64_t base = o * channels;
            const float* __restrict ap = a.data();
            if (u8) {  // the pixel's values in float, then the vector quantizer
              thread_local std::vector<float> row;
              row.resize(static_cast<size_t>(channels));
              const uint8_t* __restrict xr = x + base;
              float* __restrict r = row.data();
              const float p = pos, z = zx;
              for (int64_t c = 0; c < channels; ++c) {
                const float v = static_cast<float>(xr[c]) - z, m = v * ap[c], k = v * p;
                r[c] = v > 0.0f ? k : m;
              }
              store_u8(r, channels, zy, y + base);
            } else {
              for (int64_t c = 0; c < channels; ++c) {
                const float v = xf[base + c], m = v * ap[c];
                yf[base + c] = v > 0.0f ? v : m;
              }
            }
            continue;
          }
          for (int64_t c = 0; c < channels; ++c) {
            const float ac = a[static_cast<size_t>(c)];
            const int64_t base = (o * channels + c) * inner;
            if (u8) {
              for (int64_t k = base; k < base + inner; ++k) {
                const float v = static_cast<float>(x[k]) - zx;
                y[k] = round_u8(v * (v > 0.0f ? pos : ac), zy);
              }
            } else {
              for (int64_t k = base; k < base + inner; ++k) {
                const float v = xf[k], m = v * ac;
                yf[k] = v > 0.0f ? v : m;
              }
            }
          }
        }
      });
      return;
    }
    case QPACK_NODE_ADAPTIVE_AVGPOOL2D:
      if (u8) {
        adaptive_avg_pool(x, qx, xs, ys, [&](float v) { return qy.quant(v); }, y);
      } else {
        adaptive_avg_pool(xf, Q{1.0f, 0}, xs, ys, [](float v) { return v; }, yf);
      }
      return;
    case QPACK_NODE_CHANNELS:
    case QPACK_NODE_CHANNEL_RANGE: {
      // per outer row: the part's channels, gathered in shuffled order (runs of `inner`)
      int64_t outer, channels, inner;
      split_channels(xs, &outer, &channels, &inner);
      const bool range = n.kind == QPACK_NODE_CHANNEL_RANGE;
      const int64_t P = ys.d[1], g = range ? 1 : n.stride[0], first = range ? n.kernel[0] : n.kernel[1] * P;
      const size_t es = elem_size(xv.dtype), run = static_cast<size_t>(inner) * es;
      parallel_range(outer, 1, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const uint8_t* src = x + static_cast<size_t>(o * channels + first) * run;
          uint8_t* dst = y + static_cast<size_t>(o * P) * run;
          if (g == 1) {
            std::memcpy(dst, src, static_cast<size_t>(P) * run);
            continue;
          }
          const int64_t per = P / g;
          if (inner == 1 && g == 2) {  // ShuffleNet's: the two halves interleaved
            if (es == 4) {
              interleave2(reinterpret_cast<const float*>(src), reinterpret_cast<const float*>(src) + per, per,
                          reinterpret_cast<float*>(dst));
            } else {
              interleave2(src, src + per, per, dst);
            }
          } else if (inner == 1 && es == 4) {  // NHWC: one element per channel
            auto* d = reinterpret_cast<float*>(dst);
            const auto* sf = reinterpret_cast<const float*>(src);
            for (int64_t j = 0; j < P; ++j) d[j] = sf[(j % g) * per + j / g];
          } else if (inner == 1) {
            for (int64_t j = 0; j < P; ++j) dst[j] = src[(j % g) * per + j / g];
          } else {
            for (int64_t j = 0; j < P; ++j) {
              std::memcpy(dst + static_cast<size_t>(j) * run, src + static_cast<size_t>((j % g) * per + j / g) * run,
                          run);
            }
          }
        }
      });
      return;
    }
    case QPACK_NODE_ACTIVATION:
      parallel_range(count, kGrain, [&](int64_t b, int64_t e) {
        if (u8) {
          const uint8_t* lut = n.lut.data();
          for (int64_t i = b + lut_u8_vector(lut, x + b, e - b, y + b); i < e; ++i) y[i] = lut[x[i]];
        } else {
          activate_f32(n.act, n.act_min, n.act_max, xf + b, e - b, yf + b);
        }
      });
      return;
    case QPACK_NODE_AFFINE: {
      int64_t outer, channels, inner;
      if (n.kernel[0] == -1 && xs.rank == 4 && n.affine_scale.size() > 1) {  // W of NHWC: each pixel's run
        const int64_t W = xs.d[3], C = xs.d[1];
        const float* s = n.affine_scale.data();
        const float* t = n.affine_shift.data();
        parallel_range(xs.d[0] * xs.d[2], std::max<int64_t>(1, kGrain / std::max<int64_t>(W * C, 1)),
                       [&](int64_t b, int64_t e) {
          for (int64_t i = b * W * C; i < e * W * C; ++i) {
            const int64_t w = (i / C) % W;
            if (u8) {
              y[i] = qy.quant((qx.deq(x[i]) * s[w] + t[w]));
            } else {
              yf[i] = xf[i] * s[w] + t[w];
            }
          }
        });
        return;
      }
      if (n.affine_scale.size() == 1) {  // one scale and shift for every value (StarReLU's)
        outer = channels = 1;
        inner = xs.numel();
      } else if (n.kernel[0] == -1) {  // along the last dim: rows of it (layer scale on tokens)
        channels = xs.d[xs.rank - 1];
        outer = xs.numel() / std::max<int64_t>(channels, 1);
        inner = 1;
      } else {
        split_channels(xs, &outer, &channels, &inner);
      }
      if (u8) {  // ((x - zx) sx s + t) / sy as (x - zx) m[c] + b[c], rounded as the other u8 nodes
        std::vector<float> m(static_cast<size_t>(channels)), bias(m.size());
        for (size_t c = 0; c < m.size(); ++c) {
          m[c] = qx.scale * n.affine_scale[c] / qy.scale;
          bias[c] = n.affine_shift[c] / qy.scale;
        }
        const float zx = static_cast<float>(qx.zp), zy = static_cast<float>(qy.zp);
        parallel_range(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels * inner, 1)),
                       [&](int64_t b, int64_t e) {
          affine_u8(x + b * channels * inner, e - b, channels, inner, m.data(), bias.data(), zx, zy,
                    y + b * channels * inner);
        });
        return;
      }
      const float* s = n.affine_scale.data();
      const float* t = n.affine_shift.data();
      parallel_range(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels * inner, 1)),
                     [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          if (inner == 1) {  // NHWC: a pixel's channels, one vector loop (MixNet's 96 x 112²: 1.94 -> 0.26 ms)
            const float* xr = xf + o * channels;
            float* yr = yf + o * channels;
            for (int64_t c = 0; c < channels; ++c) yr[c] = xr[c] * s[c] + t[c];
            continue;
          }
          for (int64_t c = 0; c < channels; ++c) {
            const int64_t base = (o * channels + c) * inner;
            for (int64_t k = base; k < base + inner; ++k) yf[k] = xf[k] * s[c] + t[c];
          }
        }
      });
      return;
    }
    case QPACK_NODE_QUANTIZE:
      if (plan.nchw[n.in[0]] && !plan.nchw[n.out] && quantize_interleave_u8_vectorized(xs.d[1])) {
        const int64_t C = xs.d[1], HW = xs.d[2] * xs.d[3];  // NCHW in, NHWC out, a few channels
        for (int64_t b = 0; b < xs.d[0]; ++b) {
          parallel_range((HW + 15) / 16, 256, [&](int64_t s0, int64_t s1) {
            quantize_interleave_u8_vector(xf + b * C * HW, C, HW, s0 * 16, std::min(HW, s1 * 16),
                                          1.0f / qy.scale, static_cast<float>(qy.zp), y + b * C * HW);
          });
        }
        return;
      }
      if (plan.nchw[n.in[0]] && !plan.nchw[n.out]) {  // NCHW in, NHWC out: quantize, transpose
        thread_local std::vector<uint8_t> tmp;
        tmp.resize(static_cast<size_t>(count));
        quantize_u8_array(xf, count, QParams{qy.scale, qy.zp}, tmp.data());
        transpose_channels(tmp.data(), xs.d[0], xs.d[1], xs.d[2] * xs.d[3], 1, y);
        return;
      }
      quantize_u8_array(xf, count, QParams{qy.scale, qy.zp}, y);  // parallel inside
      return;
    case QPACK_NODE_DEQUANTIZE:
      if (plan.nchw[n.out] && !plan.nchw[n.in[0]] && ys.rank == 4) {  // NHWC u8 -> NCHW f32
        const int64_t rows = ys.d[2] * ys.d[3], cols = ys.d[1];
        for (int64_t b = 0; b < ys.d[0]; ++b) {
          const uint8_t* s = x + b * rows * cols;
          float* d = yf + b * rows * cols;
          parallel_range((rows + 31) / 32, 8, [&](int64_t rb, int64_t re) {
            const int64_t r0 = rb * 32, r1 = std::min(rows, re * 32), r8 = r0 + (r1 - r0) / 8 * 8;
            const int64_t c8 = dequantize_transpose_u8_vector(s, rows, cols, r0, r1, qx.scale, qx.zp, d);
            for (int64_t r = r0; r < r1; ++r) {
              for (int64_t c = r < r8 ? c8 : 0; c < cols; ++c) d[c * rows + r] = qx.deq(s[r * cols + c]);
            }
          });
        }
        return;
      }
      load_f32_parallel(x, count, qx, yf);
      return;
  }
}

}  // namespace qpack
