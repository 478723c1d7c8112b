#include "core/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/vec_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define QPACK_ATTN_X86 1
#endif

namespace qpack {
namespace {

constexpr int kRows = 4;  // query rows a tile

// One task's view: batch b, head h, query rows [i0, i1).
struct Head {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  const float* mask;         // or null
  const float* window_mask;  // or null; rows of S floats
  int64_t q_row, k_row, v_row, out_row, mask_row, window_row;
};

Head head(const AttentionF32& a, int64_t b, int64_t h) {
  return Head{a.q + b * a.q_stride[0] + h * a.q_stride[1], a.k + b * a.k_stride[0] + h * a.k_stride[1],
              a.v + b * a.v_stride[0] + h * a.v_stride[1], a.out + b * a.out_stride[0] + h * a.out_stride[1],
              a.mask != nullptr
                  ? a.mask + (a.mask_groups > 0 ? b % a.mask_groups : b) * a.mask_stride[0] + h * a.mask_stride[1]
                  : nullptr,
              a.window_mask != nullptr ? a.window_mask + (b % a.window_groups) * a.L * a.S : nullptr,
              a.q_stride[2], a.k_stride[2], a.v_stride[2], a.out_stride[2], a.mask_stride[2], a.S};
}

// Keys past query i's own position get no weight (PyTorch's is_causal).
inline int64_t keys_seen(const AttentionF32& a, int64_t i) { return a.causal ? std::min(a.S, i + 1) : a.S; }

void softmax_row(float* x, int64_t n) {
  if (softmax_row_f32_vector(x, n)) return;
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) top = std::max(top, x[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - top);
    sum += x[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

#ifdef QPACK_ATTN_X86
// add_masks on 16 lanes (a masked tail): the same sums, in the same order.
__attribute__((target("avx512f"))) float add_masks512(float* sc, const float* m, const float* w, int64_t n) {
  __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(k, sc + j);
    if (m != nullptr) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, m + j));
    if (w != nullptr) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, w + j));
    _mm512_mask_storeu_ps(sc + j, k, x);
    top = _mm512_mask_max_ps(top, k, top, x);
  }
  return _mm512_reduce_max_ps(top);
}
#endif

// Scores sc[0, n) plus the mask row m, then the window mask row w (either null),
// and their largest.
float add_masks(float* sc, const float* m, const float* w, int64_t n) {
#ifdef QPACK_ATTN_X86
  if (vec_math_avx512()) return add_masks512(sc, m, w, n);
#endif
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    if (m != nullptr) sc[j] += m[j];
    if (w != nullptr) sc[j] += w[j];
    top = std::max(top, sc[j]);
  }
  return top;
}

// The weights of query i's first n keys from their scaled scores in sc: the
// mask's row i added (then the window mask's, as PyTorch's Swin adds them), then
// the softmax; a row the masks hide entirely (every score -inf) weighs every key
// 0, so its output is 0 (PyTorch's, not NaN).
void weigh_row(const Head& t, int64_t i, int64_t n, float* sc) {
  if (t.mask != nullptr || t.window_mask != nullptr) {
    const float* m = t.mask != nullptr ? t.mask + i * t.mask_row : nullptr;
    const float* w = t.window_mask != nullptr ? t.window_mask + i * t.window_row : nullptr;
    const float top = add_masks(sc, m, w, n);
    if (top == -std::numeric_limits<float>::infinity()) {
      std::fill(sc, sc + n, 0.0f);
      return;
    }
  }
  softmax_row(sc, n);
}

// The plain loops: one query row at a time.
void rows_plain(const AttentionF32& a, const Head& t, int64_t i0, int64_t i1, std::vector<float>& sc) {
  sc.resize(static_cast<size_t>(a.S));
  for (int64_t i = i0; i < i1; ++i) {
    const float* q = t.q + i * t.q_row;
    const int64_t n = keys_seen(a, i);
    for (int64_t j = 0; j < n; ++j) {
      const float* k = t.k + j * t.k_row;
      float s = 0.0f;
      for (int64_t d = 0; d < a.D; ++d) s += q[d] * k[d];
      sc[j] = s * a.scale;
    }
    weigh_row(t, i, n, sc.data());
    float* o = t.out + i * t.out_row;
    std::fill(o, o + a.Dv, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float p = sc[j];
      const float* v = t.v + j * t.v_row;
      for (int64_t d = 0; d < a.Dv; ++d) o[d] += p * v[d];
    }
  }
}

#ifdef QPACK_ATTN_X86
#define QPACK_ATTN_TARGET __attribute__((target("avx512f")))

inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// kRows x V accumulators at 0.
template <int V>
QPACK_ATTN_TARGET inline void zero_tile(__m512 (&acc)[kRows][V]) {
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
}

// kRows query rows x V vectors of 16 keys from j0: sc[r][j0 + ...] = scale q[r] . k[j]
// over K transposed (kt: [D][Sp]).
template <int V>
QPACK_ATTN_TARGET void scores(const float* const* q, const float* kt, int64_t Sp, int64_t D, int64_t j0,
                              __m512 scale, float* sc) {
  __m512 acc[kRows][V];
  zero_tile<V>(acc);
  for (int64_t d = 0; d < D; ++d) {
    const float* row = kt + d * Sp + j0;
    __m512 kv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) kv[v] = _mm512_loadu_ps(row + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 qb = _mm512_set1_ps(q[r][d]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(qb, kv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(sc + r * Sp + j0 + 16 * v, _mm512_mul_ps(acc[r][v], scale));
  }
}

// kRows output rows x V vectors of the head dim from d0: out[r] = sum over the
// first n keys of p[r][j] v[j]; the last vector under `last` unless kFull (a
// masked move only for a partial vector: under a full mask they are slow on Zen 5).
template <int V, bool kFull>
QPACK_ATTN_TARGET void weighted(const float* p, int64_t Sp, const float* v0, int64_t v_row, int64_t n,
                                __mmask16 last, const float* inv, float* const* out, int rows) {
  // P sets of accumulators over alternate keys: one set of kRows x V chains is
  // too few to hide the multiply-add's latency when V <= 2 (head dims <= 32)
  constexpr int P = V <= 2 ? 2 : 1;
  __m512 acc[P][kRows][V];
#pragma GCC unroll 2
  for (int s = 0; s < P; ++s) zero_tile<V>(acc[s]);
  auto key = [&](int s, int64_t j) QPACK_ATTN_TARGET {
    const float* vrow = v0 + j * v_row;
    __m512 vv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      vv[v] = kFull || v + 1 < V ? _mm512_loadu_ps(vrow + 16 * v) : _mm512_maskz_loadu_ps(last, vrow + 16 * v);
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * Sp + j]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[s][r][v] = _mm512_fmadd_ps(pb, vv[v], acc[s][r][v]);
    }
  };
  int64_t j = 0;
  for (; j + P <= n; j += P) {
#pragma GCC unroll 2
    for (int s = 0; s < P; ++s) key(s, j + s);
  }
  for (; j < n; ++j) key(0, j);
  // r runs to the constant kRows (fully unrolled) so that acc stays in registers:
  // a loop to `rows` indexes acc at run time, and gcc then keeps every
  // accumulator on the stack, a store each per key
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) break;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      __m512 sum = acc[0][r][v];
      if (P > 1) sum = _mm512_add_ps(sum, acc[P - 1][r][v]);
      sum = _mm512_mul_ps(sum, _mm512_set1_ps(inv[r]));
      if (kFull || v + 1 < V) {
        _mm512_storeu_ps(out[r] + 16 * v, sum);
      } else {
        _mm512_mask_storeu_ps(out[r] + 16 * v, last, sum);
      }
    }
  }
}

template <bool kFull>
QPACK_ATTN_TARGET void weighted_v(int V, const float* p, int64_t Sp, const float* v0, int64_t v_row, int64_t n,
                                  __mmask16 last, const float* inv, float* const* out, int rows) {
  switch (V) {
    case 4: weighted<4, kFull>(p, Sp, v0, v_row, n, last, inv, out, rows); break;
    case 3: weighted<3, kFull>(p, Sp, v0, v_row, n, last, inv, out, rows); break;
    case 2: weighted<2, kFull>(p, Sp, v0, v_row, n, last, inv, out, rows); break;
    default: weighted<1, kFull>(p, Sp, v0, v_row, n, last, inv, out, rows); break;
  }
}

// Query rows [i0, i1) of one head: the scores of kRows rows at a time against
// K transposed (zero past S), each row's softmax, then the rows' weighted sums
// of V's rows.
QPACK_ATTN_TARGET void rows512(const AttentionF32& a, const Head& t, int64_t i0, int64_t i1, std::vector<float>& kt,
                               std::vector<float>& sc) {
  const int64_t S = a.S, D = a.D, Sp = (S + 15) / 16 * 16;
  kt.resize(static_cast<size_t>(D * Sp));
  for (int64_t d = 0; d < D; ++d) {  // (rows of kt written in order; K's rows stay in cache)
    float* row = kt.data() + d * Sp;
    const float* k = t.k + d;
    for (int64_t j = 0; j < S; ++j) row[j] = k[j * t.k_row];
    std::fill(row + S, row + Sp, 0.0f);
  }
  sc.resize(static_cast<size_t>(kRows * Sp));
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t r0 = i0; r0 < i1; r0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, i1 - r0));
    const float* q[kRows];
    float* out[kRows];
    for (int r = 0; r < kRows; ++r) {
      q[r] = t.q + std::min<int64_t>(r0 + r, i1 - 1) * t.q_row;  // past i1: repeats, not stored
      out[r] = t.out + std::min<int64_t>(r0 + r, i1 - 1) * t.out_row;
    }
    int64_t j0 = 0;
    for (; j0 + 64 <= Sp; j0 += 64) scores<4>(q, kt.data(), Sp, D, j0, scale, sc.data());
    switch ((Sp - j0) / 16) {
      case 3: scores<3>(q, kt.data(), Sp, D, j0, scale, sc.data()); break;
      case 2: scores<2>(q, kt.data(), Sp, D, j0, scale, sc.data()); break;
      case 1: scores<1>(q, kt.data(), Sp, D, j0, scale, sc.data()); break;
      default: break;
    }
    // each row's weights: without a mask or causality the rows' exps at once,
    // their sums' inverses scaling the outputs (inv); else a row at a time
    int64_t n = 0;
    float inv[kRows] = {1.0f, 1.0f, 1.0f, 1.0f};
    const bool together = t.mask == nullptr && t.window_mask == nullptr && !a.causal &&
                          exp_rows_f32_vector(sc.data(), rows, Sp, S, inv);
    for (int r = 0; r < kRows; ++r) {
      const int64_t seen = r < rows ? keys_seen(a, r0 + r) : 0;
      if (r < rows && !together) weigh_row(t, r0 + r, seen, sc.data() + r * Sp);
      std::fill(sc.data() + r * Sp + seen, sc.data() + (r + 1) * Sp, 0.0f);  // unseen keys weigh 0
      n = std::max(n, seen);
    }
    for (int64_t d0 = 0; d0 < a.Dv; d0 += 64) {  // V's rows, out's rows: Dv floats
      const int V = static_cast<int>(std::min<int64_t>(4, (a.Dv - d0 + 15) / 16));
      const __mmask16 last = lanes(a.Dv - d0 - 16 * (V - 1));
      float* o[kRows];
      for (int r = 0; r < kRows; ++r) o[r] = out[r] + d0;
      if (last == __mmask16(0xFFFF)) {
        weighted_v<true>(V, sc.data(), Sp, t.v + d0, t.v_row, n, last, inv, o, rows);
      } else {
        weighted_v<false>(V, sc.data(), Sp, t.v + d0, t.v_row, n, last, inv, o, rows);
      }
    }
  }
}
#endif

}  // namespace

void attention_f32(const AttentionF32& a) {
  check(a.B >= 0 && a.H >= 0 && a.L >= 0 && a.S >= 0 && a.D >= 1 && a.Dv >= 1, QPACK_STATUS_INVALID_ARGUMENT,
        "attention sizes must be B, H, L, S >= 0 and D, Dv >= 1, got B=", a.B, " H=", a.H, " L=", a.L, " S=", a.S,
        " D=", a.D, " Dv=", a.Dv);
  check(a.q != nullptr && a.k != nullptr && a.v != nullptr && a.out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
        "attention: q, k, v and out must not be NULL");
  check(a.S > 0 || a.L == 0, QPACK_STATUS_INVALID_ARGUMENT, "attention over no keys (S = 0) of ", a.L,
        " queries");
  check(std::isfinite(a.scale), QPACK_STATUS_INVALID_ARGUMENT, "attention scale must be finite, got ", a.scale);
  check(a.mask_groups >= 0, QPACK_STATUS_INVALID_ARGUMENT, "attention mask groups must be >= 0, got ",
        a.mask_groups);
  check(a.window_mask == nullptr || a.window_groups >= 1, QPACK_STATUS_INVALID_ARGUMENT,
        "attention window masks need groups >= 1, got ", a.window_groups);
  if (a.B == 0 || a.H == 0 || a.L == 0) return;
  const int threads = num_threads();
  const int64_t heads = a.B * a.H;
  // query rows split so that every thread gets work when heads are few
  const int64_t per_head = std::max<int64_t>(1, std::min<int64_t>((threads + heads - 1) / heads,
                                                                    (a.L + kRows - 1) / kRows));
  parallel_chunks(heads * per_head, 2, threads, [&](int, int64_t begin, int64_t end) {
    std::vector<float> kt, sc;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / per_head, part = task % per_head;
      const Head t = head(a, bh / a.H, bh % a.H);
      const int64_t i0 = a.L * part / per_head, i1 = a.L * (part + 1) / per_head;
#ifdef QPACK_ATTN_X86
      if (vec_math_avx512()) {
        rows512(a, t, i0, i1, kt, sc);
        continue;
      }
#endif
      rows_plain(a, t, i0, i1, sc);
    }
  });
}

}  // namespace qpack
