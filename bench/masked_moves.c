/* Masked against plain AVX-512 moves streaming from and to memory (64 MB,
 * beyond every cache): the measurement behind qpack's rule of moving whole
 * vectors unmasked and masking only a tail (src/core/vec_math.cc's load16 /
 * store16, the int8 kernels' stores).
 *
 *   gcc -O2 -mavx512f -mavx512bw bench/masked_moves.c -o /tmp/masked_moves && /tmp/masked_moves
 *
 * One Zen 5 core (5 December 2026, three rounds): masked loads 4.4-4.9 ms
 * against 1.7-2.8 plain, masked 48-byte stores 4.2-4.4 against 1.9-2.0 as a
 * 32- and a 16-byte store; on 64 KB in L1 the two cost the same (0.5-0.6 us
 * a pass either way). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

/* Sums of n floats, every vector loaded under a mask that is full but for the
 * last (noipa: so that the compiler cannot see the masks are full and drop them). */
__attribute__((noipa)) static float load_masked(const float* x, long n) {
  __m512 s = _mm512_setzero_ps();
  for (long i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, x + i));
  }
  return _mm512_reduce_add_ps(s);
}

__attribute__((noipa)) static float load_plain(const float* x, long n) {
  __m512 s = _mm512_setzero_ps();
  for (long i = 0; i < n; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + i));
  return _mm512_reduce_add_ps(s);
}

/* rows of 48 bytes (16 pixels of 3 channels), one masked 64-byte store each */
__attribute__((noipa)) static void store_masked(uint8_t* y, long rows, __m512i v) {
  for (long i = 0; i < rows; ++i) _mm512_mask_storeu_epi8(y + 48 * i, (1ull << 48) - 1, v);
}

__attribute__((noipa)) static void store_plain(uint8_t* y, long rows, __m512i v) {
  for (long i = 0; i < rows; ++i) {
    _mm256_storeu_si256((__m256i*)(y + 48 * i), _mm512_castsi512_si256(v));
    _mm_storeu_si128((__m128i*)(y + 48 * i + 32), _mm512_extracti32x4_epi32(v, 2));
  }
}

int main(void) {
  const long n = 1L << 24; /* floats: 64 MB */
  float* x = aligned_alloc(64, (size_t)n * 4);
  uint8_t* y = aligned_alloc(64, (size_t)n * 4);
  if (x == NULL || y == NULL) return 1;
  for (long i = 0; i < n; ++i) x[i] = 1.0f;
  for (long i = 0; i < n * 4; ++i) y[i] = 0;
  const long rows = n * 4 / 48 - 2;
  const __m512i v = _mm512_set1_epi8(1);
  float sink = 0.0f;
  for (int r = 0; r < 3; ++r) {
    double t = now_us();
    sink += load_masked(x, n);
    const double lm = now_us() - t;
    t = now_us();
    sink += load_plain(x, n);
    const double lp = now_us() - t;
    t = now_us();
    store_masked(y, rows, v);
    const double sm = now_us() - t;
    t = now_us();
    store_plain(y, rows, v);
    const double sp = now_us() - t;
    printf("64 MB: loads masked %.0f us, plain %.0f us; 48-byte stores masked %.0f us, plain %.0f us\n", lm, lp, sm,
           sp);
  }
  return sink == 0.0f;
}
