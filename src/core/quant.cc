#include "core/quant.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "core/vec_math.h"

namespace qpack {

QParams choose_qparams_u8(float min, float max, int32_t qmax) {
  const int32_t qmin = 0;
  min = std::min(min, 0.0f);
  max = std::max(max, 0.0f);
  double scale = (static_cast<double>(max) - min) / (qmax - qmin);
  if (static_cast<float>(scale) == 0.0f || std::isinf(1.0f / static_cast<float>(scale))) {
    scale = 0.1;
  }
  constexpr float kSmallScale = 6.1e-5f;
  if (scale < kSmallScale) {
    float org_scale = static_cast<float>(scale);
    scale = kSmallScale;
    if (min == 0.0f) {
      max = kSmallScale * (qmax - qmin);
    } else if (max == 0.0f) {
      min = -kSmallScale * (qmax - qmin);
    } else {
      float amplifier = kSmallScale / org_scale;
      min *= amplifier;
      max *= amplifier;
    }
  }
  double zp_from_min = qmin - min / scale;
  double zp_from_max = qmax - max / scale;
  double zp_from_min_error = std::abs(qmin) - std::abs(min / scale);
  double zp_from_max_error = std::abs(qmax) - std::abs(max / scale);
  double initial_zp = zp_from_min_error < zp_from_max_error ? zp_from_min : zp_from_max;
  int32_t zp;
  if (initial_zp < qmin) {
    zp = qmin;
  } else if (initial_zp > qmax) {
    zp = qmax;
  } else {
    zp = static_cast<int32_t>(std::nearbyint(initial_zp));
  }
  return QParams{static_cast<float>(scale), zp};
}

std::vector<int32_t> quantize_bias_i32(const std::vector<float>& bias,
                                       const std::vector<float>& weight_scales,
                                       float input_scale, int64_t channels) {
  std::vector<int32_t> q(static_cast<size_t>(channels), 0);
  if (bias.empty()) return q;
  const bool per_channel = weight_scales.size() > 1;
  for (int64_t n = 0; n < channels; ++n) {
    const float s = weight_scales[per_channel ? n : 0] * input_scale;
    const double v = std::nearbyint(static_cast<double>(bias[n]) / s);
    check(std::fabs(v) <= double(int64_t(1) << 30), QPACK_STATUS_INVALID_ARGUMENT, "bias[", n,
          "] = ", bias[n], " is ", v, " in units of input_scale * weight_scale (", input_scale,
          " * ", weight_scales[per_channel ? n : 0],
          "): it does not fit QNNPACK's int32 bias. The input scale is too small for this "
          "bias; calibrate a larger input scale, or use backend='onednn' (float bias)");
    q[n] = static_cast<int32_t>(v);
  }
  return q;
}

uint8_t* quantize_buffer(size_t size) {
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
  };
  // QNNPACK's kernels read up to 7 bytes before a row and past its end: 16
  // readable bytes on both sides (as PyTorch's mobile allocator keeps).
  thread_local Buffer buffer;
  if (buffer.size < size + 32) {
    buffer.data.reset(new uint8_t[size + 32]);
    buffer.size = size + 32;
  }
  return buffer.data.get() + 16;
}

namespace {
constexpr int64_t kParallelGrain = int64_t(1) << 16;

// Round-half-to-even by the float magic-number trick (input is finite: min_max
// checked it); plain loops the compiler vectorises.
// Not under sanitizers: an ifunc resolver runs before their runtime is up.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define QPACK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define QPACK_CLONES
#endif

QPACK_CLONES
void quantize_range(const float* x, int64_t n, float inv_scale, float zp, uint8_t* out) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    // Past 2^22 the trick may be off by one, but such values clamp to 0 or 255.
    float v = (x[i] * inv_scale + magic) - magic + zp;
    v = std::max(v, 0.0f);
    v = std::min(v, 255.0f);
    out[i] = static_cast<uint8_t>(static_cast<int32_t>(v));
  }
}

QPACK_CLONES
void affine2_range(const uint8_t* __restrict x0, const uint8_t* __restrict x1, int64_t n, float a,
                   float b, float c, float lo, float hi, uint8_t* __restrict y) {
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding and subtracting rounds half to even
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float v = a * static_cast<float>(x0[i]) + b * static_cast<float>(x1[i]) + c;
    v = (v + magic) - magic;
    v = std::max(v, lo);
    v = std::min(v, hi);
    y[i] = static_cast<uint8_t>(static_cast<int32_t>(v));
  }
}

QPACK_CLONES
void min_max_range(const float* x, int64_t n, float* lo_out, float* hi_out, int64_t* nan_out) {
  float lo = x[0], hi = x[0];
  int64_t nans = 0;
#pragma omp simd reduction(min : lo) reduction(max : hi) reduction(+ : nans)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    nans += (v != v);
  }
  *lo_out = lo;
  *hi_out = hi;
  *nan_out = nans;
}
}  // namespace

void quantize_u8_array(const float* x, int64_t n, QParams q, uint8_t* out) {
  const float inv_scale = 1.0f / q.scale;
  const float zp = static_cast<float>(q.zero_point);
  parallel_chunks(n, kParallelGrain, num_threads(), [&](int, int64_t begin, int64_t end) {
    const int64_t done = begin + quantize_u8_vector(x + begin, end - begin, inv_scale, zp, out + begin);
    quantize_range(x + done, end - done, inv_scale, zp, out + done);
  });
}

void min_max(const float* x, int64_t n, float* min_out, float* max_out) {
  if (n == 0) {
    *min_out = *max_out = 0.0f;
    return;
  }
  const int threads = num_threads();
  std::vector<float> los(threads, x[0]), his(threads, x[0]);
  std::vector<int64_t> counts(threads, 0);
  const int chunks = parallel_chunks(n, kParallelGrain, threads, [&](int t, int64_t begin, int64_t end) {
    if (end > begin) min_max_range(x + begin, end - begin, &los[t], &his[t], &counts[t]);
  });
  const float lo = *std::min_element(los.begin(), los.begin() + chunks);
  const float hi = *std::max_element(his.begin(), his.begin() + chunks);
  int64_t nans = 0;
  for (int t = 0; t < chunks; ++t) nans += counts[t];
  check(nans == 0 && std::isfinite(lo) && std::isfinite(hi), QPACK_STATUS_INVALID_ARGUMENT,
        "dynamic quantization needs finite input; the input holds NaN or infinity");
  *min_out = lo;
  *max_out = hi;
}

void add_u8(const uint8_t* x0, QParams q0, const uint8_t* x1, QParams q1, int64_t n, QParams qy,
            uint8_t lo, uint8_t hi, uint8_t* y) {
  const float a = q0.scale / qy.scale, b = q1.scale / qy.scale;
  const float c = static_cast<float>(qy.zero_point) - a * static_cast<float>(q0.zero_point) -
                  b * static_cast<float>(q1.zero_point);
  parallel_chunks(n, kParallelGrain, num_threads(), [&](int, int64_t begin, int64_t end) {
    begin += affine2_u8_vector(x0 + begin, x1 + begin, end - begin, a, b, c, lo, hi, y + begin);
    affine2_range(x0 + begin, x1 + begin, end - begin, a, b, c, lo, hi, y + begin);
  });
}

DynamicInput quantize_dynamic(const float* x, int64_t n) {
  float lo, hi;
  min_max(x, n, &lo, &hi);
  const QParams q = choose_qparams_u8(lo, hi);
  uint8_t* data = quantize_buffer(static_cast<size_t>(n));
  quantize_u8_array(x, n, q, data);
  return DynamicInput{data, q};
}

}  // namespace qpack
