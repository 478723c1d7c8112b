// Elementwise float functions of the graph's nodes, vectorized
// with AVX-512F or AVX2+FMA where the CPU has them (chosen at run time; the
// core is built for the baseline ISA). exp reduces its argument by ln 2 and
// evaluates a polynomial: Cephes' single-precision one with AVX2 (within 2
// ulp of std::exp on [-87, 88]; +inf above 88.38, 0 below -88.38), a
// degree-4 fit with AVX-512 (sigmoid within 3.1 ulp of float64's on
// [-110, 110]; +inf, denormals and 0 where std::exp gives them); NaN kept.
// Sigmoid and SiLU divide once (1 / (1 + exp(-x)), x / (1 + exp(-x)), so
// SiLU overflows to -0 below -88.7 as PyTorch's float loop does); GELU's erf
// is a polynomial near 0 and 1 - exp(-z^2 + R(z))
// beyond (within 1e-7 of std::erf-based values, vec_math.cc). Elsewhere the
// callers' scalar loops run.
#pragma once

#include <cstdint>

#include "qpack/qpack.h"

namespace qpack {

// y[i] = act(x[i]) for SIGMOID, SILU and GELU (x and y may be the same array);
// false, and nothing written, for other activations or without the ISA.
bool activate_f32_vector(qpack_activation act, const float* x, float* y, int64_t n);
// LayerNorm of `rows` contiguous rows of C values (graph.cc's layer_norm_rows,
// the same steps: the mean, the biased variance of x - mean, then (x - mean)
// / sqrt(var + eps) w[c] + b[c]; sums in vector lanes, so in another order):
// true when done (AVX-512F or AVX2+FMA), false, and nothing written, without.
bool layer_norm_f32_vector(const float* x, int64_t rows, int64_t C, const float* w, const float* b, float eps,
                           float* y);
// Whether activate_f32_vector does act's work on this CPU.
bool activate_f32_vectorized(qpack_activation act);

// y[i] = clamp(round_half_even(x[i] * inv_scale) + zero_point, 0, 255), the
// rounding PyTorch's quantize uses, exactly as quant.cc's scalar loop (finite
// x), for a prefix of the n values: returns its length (all n with AVX-512F,
// whole vectors of 8 with AVX2, 0 without either); the caller does the rest.
int64_t quantize_u8_vector(const float* x, int64_t n, float inv_scale, float zero_point, uint8_t* y);

// Whether this file's AVX-512 code runs here (the CPU has AVX-512F and
// QPACK_VEC_MATH is not 0): other files' AVX-512 loops follow it.
bool vec_math_avx512();

// x = softmax(x) over one row of n floats in place (exp(x - max) / sum; -inf
// gives 0): true when done (AVX-512F), false, and nothing written, without.
bool softmax_row_f32_vector(float* x, int64_t n);
// Rows 0..rows-1 (1 to 4) of x, stride floats apart, n each: exp(x - the row's
// max) in place and inv[r] = 1 / the row's sum (a softmax less its last scale),
// with AVX-512; false (x untouched) without it or for another row count.
bool exp_rows_f32_vector(float* x, int rows, int64_t stride, int64_t n, float* inv);

// Pixels [p0, p1) of one NCHW image of C float planes of HW values quantized
// as quantize_u8_vector into NHWC bytes (y: the image's, pixel p at y + p C):
// true when done (C <= 4, AVX-512 VBMI), false, and nothing written, without.
bool quantize_interleave_u8_vector(const float* x, int64_t C, int64_t HW, int64_t p0, int64_t p1, float inv_scale,
                                   float zero_point, uint8_t* y);
// Whether quantize_interleave_u8_vector does that work for C channels here.
bool quantize_interleave_u8_vectorized(int64_t C);

// y[i] = clamp(round_half_even(a x0[i] + b x1[i] + c), lo, hi) (a u8 add
// requantized) for a prefix of the n values: returns its length (whole
// vectors of 16 with AVX-512F, 0 without); the caller does the rest.
int64_t affine2_u8_vector(const uint8_t* x0, const uint8_t* x1, int64_t n, float a, float b, float c,
                          uint8_t lo, uint8_t hi, uint8_t* y);

// y[i] = lut[x[i]] (a u8 activation's 256-entry table; x and y may be the same
// array) for a prefix of the n values: returns its length (all n with AVX-512
// VBMI, 0 without); the caller does the rest.
int64_t lut_u8_vector(const uint8_t* lut, const uint8_t* x, int64_t n, uint8_t* y);

// o[c] = the max over a window of kh x kw NHWC pixels of C channels, x its
// top-left pixel, rows `row` values apart (a max pooling's output pixel; for
// floats p > m ? p : m in pixel order, as graph.cc's scalar loop): true when
// done (AVX-512F with BW and VL, for both), false, and nothing written, without.
bool max_window_vector(const uint8_t* x, int64_t row, int64_t C, int64_t kh, int64_t kw, uint8_t* o);
bool max_window_vector(const float* x, int64_t row, int64_t C, int64_t kh, int64_t kw, float* o);

// y = round_u8((x - zx) m[c] + b[c], zy) over outer x channels x inner values,
// channel c's m[c] and b[c] for each run of inner values (inner = 1: NHWC rows
// of channels); b may be NULL (no shift). round_u8 is graph.cc's: round half to
// even, + zy, clamped to [0, 255]; the same float operations in the same
// order as graph.cc's scalar loop (a product, then a sum: no FMA), so the same
// values. True when done (AVX-512F with BW and VL, for the masked byte loads),
// false, and nothing written, without.
bool affine_u8_vector(const uint8_t* x, int64_t outer, int64_t channels, int64_t inner, const float* m,
                      const float* b, float zx, float zy, uint8_t* y);

// y[i] = (x[i] - zero_point) * scale, exactly as graph.cc's scalar dequantize,
// for a prefix of the n values: returns its length (whole vectors of 8 with
// AVX2, 0 without); the caller does the rest.
int64_t dequantize_u8_vector(const uint8_t* x, int64_t n, float scale, int32_t zero_point, float* y);

// Rows [r0, r1) of s [rows][cols] into d [cols][rows]: the whole 8 x 8 blocks
// (rows r0 up to the last whole 8 from r0, columns up to the last whole 8),
// with AVX2. Returns the columns done, 0 without AVX2 or below 8 columns; the
// caller does the rest.
int64_t transpose_f32_vector(const float* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1, float* d);
// transpose_f32_vector of u8 data dequantized on the way, (x - zero_point) *
// scale as dequantize_u8_vector: the same whole blocks, the same return.
int64_t dequantize_transpose_u8_vector(const uint8_t* s, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                                       float scale, int32_t zero_point, float* d);

// y[i] = round_u8((x0[i] - z0) (x1[i] - z1) k, zy) (an equal-shape u8 mul;
// the same operations as graph.cc's scalar loop): true when done (as
// affine_u8_vector), false without the ISA.
bool mul_u8_vector(const uint8_t* x0, const uint8_t* x1, int64_t n, float z0, float z1, float k, float zy,
                   uint8_t* y);

}  // namespace qpack
