/* Peak of one core: an fp32 FMA loop (GFLOP/s, 2 flops per lane per FMA) and an
 * int8 dot-product loop (G int8 op/s, 2 ops per u8*s8 multiply-add), one thread.
 * Built by bench/_peak.py with gcc -O2 and the widest ISA the CPU has:
 *   AVX-512 F + VNNI (zmm vfmadd231ps / vpdpbusd), else AVX2 + FMA (ymm vfmadd231ps;
 *   int8 through AVX-VNNI vpdpbusd ymm when built with -mavxvnni, else
 *   vpmaddubsw + vpmaddwd + vpaddd, counted as the MACs they do).
 * 12 independent accumulators per loop hide the 4-5 cycle latency of two pipes.
 * Prints "fp32_gflops <x>", "int8_gops <x>", "isa <name>"; best of several repeats. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define N_ACC 12
#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

#if defined(__AVX512F__)
typedef __m512 vf;
typedef __m512i vi;
#define LANES 16
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUM(a) _mm512_reduce_add_ps(a)
#define ISET1(x) _mm512_set1_epi32(x)
#define IADD(a, b) _mm512_add_epi32(a, b)
#define IEXTRACT(a) _mm_cvtsi128_si32(_mm512_castsi512_si128(a))
#else
typedef __m256 vf;
typedef __m256i vi;
#define LANES 8
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
static float VSUM(__m256 a) {
    float t[8];
    _mm256_storeu_ps(t, a);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#define ISET1(x) _mm256_set1_epi32(x)
#define IADD(a, b) _mm256_add_epi32(a, b)
#define IEXTRACT(a) _mm_cvtsi128_si32(_mm256_castsi256_si128(a))
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define ISA_INT8 "avx512_vnni"
#define DOT(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define MACS_PER_DOT (LANES * 4)
#elif defined(__AVXVNNI__)
#define ISA_INT8 "avx_vnni"
#define DOT(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#define MACS_PER_DOT (LANES * 4)
#else
#define ISA_INT8 "avx2 (pmaddubsw+pmaddwd)"
#define ISA_AVX2_INT8 1
#define MACS_PER_DOT (LANES * 4)
#endif

static double fp32_gflops(long iters) {
    volatile float seed = 1e-7f;
    vf a = VSET1(seed), b = VSET1(0.999999f);
#define DECL(i) vf c##i = VSET1((float)(i));
    REP12(DECL)
    double t0 = now();
    for (long k = 0; k < iters; ++k) {
#define STEP(i) c##i = VFMA(c##i, b, a);
        REP12(STEP)
        __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5));
        __asm__ volatile("" : "+v"(c6), "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
    }
    double t = now() - t0;
    vf s = VADD(VADD(VADD(c0, c1), VADD(c2, c3)), VADD(VADD(c4, c5), VADD(c6, c7)));
    s = VADD(s, VADD(VADD(c8, c9), VADD(c10, c11)));
    if (VSUM(s) == 12345.f) puts("");
    return (double)iters * N_ACC * LANES * 2 / t / 1e9;
}

#if defined(ISA_AVX2_INT8)
/* pmaddubsw + pmaddwd + paddd on 8 chains (a, a1) x (b0-b3), each product distinct
 * (the compiler would merge equal ones). Only the paddd is carried from one iteration
 * to the next; a, a1, one, b0-b3, d0-d3, e0-e3 and one temporary fit the 16 ymm
 * registers: a spilled accumulator would put a store-to-load round trip on its chain
 * and measure that instead (the first version of this loop did, and read 104 G op/s
 * on a Zen 3 whose multipliers do 194). */
static double int8_gops(long iters) {
    volatile int seed = 0x01020304;
    vi a = ISET1(seed), a1 = ISET1(seed ^ 0x0f0f0f0f), one = _mm256_set1_epi16(1);
#define B4(X) X(0) X(1) X(2) X(3)
#define BDECL(i) vi b##i = ISET1(seed + 3 * i); vi d##i = ISET1(i); vi e##i = ISET1(i);
    B4(BDECL)
    double t0 = now();
    for (long k = 0; k < iters; ++k) {
#define BSTEP(i) d##i = _mm256_add_epi32(d##i, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b##i), one)); e##i = _mm256_add_epi32(e##i, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, b##i), one));
        B4(BSTEP)
        __asm__ volatile("" : "+v"(d0), "+v"(d1), "+v"(d2), "+v"(d3));
        __asm__ volatile("" : "+v"(e0), "+v"(e1), "+v"(e2), "+v"(e3), "+v"(a1));
        __asm__ volatile("" : "+v"(a), "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3)); /* no hoisting */
    }
    double t = now() - t0;
    vi s = IADD(IADD(IADD(d0, d1), IADD(d2, d3)), IADD(IADD(e0, e1), IADD(e2, e3)));
    if (IEXTRACT(s) == 12345) puts("");
    return (double)iters * 8 * MACS_PER_DOT * 2 / t / 1e9;
}
#else
static double int8_gops(long iters) {
    volatile int seed = 0x01020304;
    vi a = ISET1(seed), b = ISET1(seed ^ 0x01010101);
#define IDECL(i) vi d##i = ISET1(i);
    REP12(IDECL)
    double t0 = now();
    for (long k = 0; k < iters; ++k) {
#define ISTEP(i) d##i = DOT(d##i, a, b);
        REP12(ISTEP)
        __asm__ volatile("" : "+v"(d0), "+v"(d1), "+v"(d2), "+v"(d3), "+v"(d4), "+v"(d5));
        __asm__ volatile("" : "+v"(d6), "+v"(d7), "+v"(d8), "+v"(d9), "+v"(d10), "+v"(d11));
    }
    double t = now() - t0;
    vi s = IADD(IADD(IADD(d0, d1), IADD(d2, d3)), IADD(IADD(d4, d5), IADD(d6, d7)));
    s = IADD(s, IADD(IADD(d8, d9), IADD(d10, d11)));
    if (IEXTRACT(s) == 12345) puts("");
    return (double)iters * N_ACC * MACS_PER_DOT * 2 / t / 1e9;
}
#endif

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0.05; /* per repeat */
    int repeats = argc > 2 ? atoi(argv[2]) : 20;
    double best_f = 0, best_i = 0;
    long it = 1000;
    while (1) { /* calibrate the iteration count to `seconds` */
        double t0 = now();
        fp32_gflops(it);
        if (now() - t0 > seconds / 4) break;
        it *= 2;
    }
    it *= 4;
    for (int r = 0; r < repeats; ++r) {
        double f = fp32_gflops(it), i = int8_gops(it);
        if (f > best_f) best_f = f;
        if (i > best_i) best_i = i;
    }
#if defined(__AVX512F__)
    printf("isa avx512f+fma/%s\n", ISA_INT8);
#else
    printf("isa avx2+fma/%s\n", ISA_INT8);
#endif
    printf("fp32_gflops %.2f\nint8_gops %.2f\n", best_f, best_i);
    return 0;
}
