// QNNPACK linear: static quint8 (qnnpackLinear) and dynamic (qnnpackLinearDynamic).
//
// Packed layout (PackBMatrix, pytorch_pack_q8gemm_wrq in the 1.13 source),
// for each block of nr output channels:
//   int32 bias[nr]                      (static: round(bias / (in_scale * w_scale)))
//   for each block of kr input channels:
//     for each of the nr channels: kr uint8 weights (int8 + 128), padded with
//     the channel's kernel zero point; channels past N padded likewise.
// So one block is nr * (4 + k_stride) bytes. The weights are invertible
// (subtract 128); the int32 bias is not, so the float bias is kept beside it
// (N floats) to re-pack for a new input scale without the original weight.
#include <pytorch_qnnpack.h>
#include <qnnpack_func.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/qnnpack/runtime.h"
#include "core/error.h"
#include "core/linear.h"
#include "core/quant.h"

namespace qpack {
namespace {

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

// One immutable packed state: weights plus the int32 bias for one input scale.
struct State {
  float input_scale = 0;  // 0: bias slots not filled yet (static) / unused (dynamic)
  Buffer packed;
  size_t packed_size = 0;
  std::vector<float> requant_scales;  // static, padded to n_stride + 8
};

class QnnpackLinear final : public LinearKernel {
 public:
  QnnpackLinear(const LinearSpec& spec, const void* weight) : spec_(spec) {
    qnnpack_rt::ensure_initialized();
    nr_ = qnnpack_rt::gemm_nr();
    kr_ = qnnpack_rt::gemm_kr();
    n_stride_ = (spec_.N + nr_ - 1) / nr_ * nr_;
    k_stride_ = (spec_.K + kr_ - 1) / kr_ * kr_;
    packed_size_ = static_cast<size_t>(n_stride_) * (k_stride_ + sizeof(int32_t));

    const int64_t padded = n_stride_ + 8;
    kernel_zero_points_.assign(padded, 128);
    weight_scales_.assign(padded, 1.0f);
    for (int64_t n = 0; n < spec_.N; ++n) {
      kernel_zero_points_[n] = static_cast<uint8_t>(spec_.weight_zero_point(n) + 128);
      weight_scales_[n] = spec_.weight_scale(n);
    }

    // QNNPACK wants uint8 weights: int8 + 128, as PyTorch does.
    const int8_t* w = static_cast<const int8_t*>(weight);
    std::vector<uint8_t> shifted(static_cast<size_t>(spec_.N * spec_.K));
    for (size_t i = 0; i < shifted.size(); ++i) {
      shifted[i] = static_cast<uint8_t>(static_cast<int32_t>(w[i]) + 128);
    }
    std::vector<int32_t> qbias;
    float input_scale = 0.0f;
    if (spec_.mode == QPACK_MODE_INT8_STATIC && spec_.input_scale > 0.0f) {
      input_scale = spec_.input_scale;
      qbias = quantize_bias(input_scale);
    }
    // PackBMatrix only validates the requantization scales; the weight scales
    // are valid stand-ins for an unknown input scale.
    qnnpack::PackBMatrix packer(static_cast<size_t>(spec_.K), static_cast<size_t>(spec_.N),
                                kernel_zero_points_.data(), weight_scales_.data(),
                                shifted.data(), qbias.empty() ? nullptr : qbias.data());
    check(packer.getPackedWeights() != nullptr, QPACK_STATUS_OUT_OF_MEMORY,
          "QNNPACK could not allocate ", packed_size_, " bytes for packed weights");
    auto state = std::make_shared<State>();
    state->input_scale = input_scale;
    state->packed = allocate();
    state->packed_size = packed_size_;
    std::memcpy(state->packed.get(), packer.getPackedWeights(), packed_size_);
    if (input_scale > 0.0f) state->requant_scales = requant_scales(input_scale);
    publish(std::move(state));
  }

  void run_u8(int64_t M, const uint8_t* x, float input_scale, int32_t input_zero_point,
              uint8_t* y) const override {
    if (spec_.mode != QPACK_MODE_INT8_STATIC) LinearKernel::run_u8(M, x, 0, 0, y);
    check_scale(input_scale, "input scale", -1);
    check_u8_zero_point(input_zero_point, "input zero point");
    auto state = state_for(input_scale);
    counters_.runs.fetch_add(1, std::memory_order_relaxed);
    if (M == 0) return;
    uint8_t qmin, qmax;
    output_bounds_u8(spec_.clamp_min, spec_.clamp_max, spec_.output_scale,
                     spec_.output_zero_point, &qmin, &qmax);
    auto status = qnnpack::qnnpackLinear(
        static_cast<size_t>(M), static_cast<size_t>(spec_.K), static_cast<size_t>(spec_.N),
        static_cast<uint8_t>(input_zero_point), kernel_zero_points_.data(),
        state->requant_scales.data(), static_cast<uint8_t>(spec_.output_zero_point), qmin, qmax,
        x, static_cast<size_t>(spec_.K), state->packed.get(), y, static_cast<size_t>(spec_.N),
        qnnpack_rt::thread_pool());
    check(status == pytorch_qnnp_status_success, QPACK_STATUS_BACKEND_ERROR,
          "qnnpackLinear failed with status ", static_cast<int>(status));
  }

  void run_f32(int64_t M, const float* x, float* y) const override {
    if (spec_.mode != QPACK_MODE_INT8_DYNAMIC) LinearKernel::run_f32(M, x, y);
    counters_.runs.fetch_add(1, std::memory_order_relaxed);
    if (M == 0) return;
    const int64_t count = M * spec_.K;
    float lo, hi;
    min_max(x, count, &lo, &hi);
    QParams q = choose_qparams_u8(lo, hi);
    uint8_t* qx = quantize_buffer(static_cast<size_t>(count));
    quantize_u8_array(x, count, q, qx);
    std::vector<float> dequant(weight_scales_.size());
    for (size_t i = 0; i < dequant.size(); ++i) dequant[i] = weight_scales_[i] * q.scale;
    std::vector<float> zero_bias;
    const float* bias = spec_.bias.data();
    if (spec_.bias.empty()) {
      zero_bias.assign(static_cast<size_t>(n_stride_), 0.0f);
      bias = zero_bias.data();
    }
    auto state = std::atomic_load(&latest_);
    auto status = qnnpack::qnnpackLinearDynamic(
        static_cast<size_t>(M), static_cast<size_t>(spec_.K), static_cast<size_t>(spec_.N),
        static_cast<uint8_t>(q.zero_point), kernel_zero_points_.data(), dequant.data(),
        qx, static_cast<size_t>(spec_.K), state->packed.get(), bias, y,
        static_cast<size_t>(spec_.N), qnnpack_rt::thread_pool());
    check(status == pytorch_qnnp_status_success, QPACK_STATUS_BACKEND_ERROR,
          "qnnpackLinearDynamic failed with status ", static_cast<int>(status));
    clamp_f32(y, M * spec_.N);
  }

  void unpack_weight(void* out) const override {
    auto state = std::atomic_load(&latest_);
    const uint8_t* base = state->packed.get();
    int8_t* w = static_cast<int8_t*>(out);
    const size_t block_bytes = static_cast<size_t>(nr_) * (sizeof(int32_t) + k_stride_);
    for (int64_t n = 0; n < spec_.N; ++n) {
      const uint8_t* block = base + static_cast<size_t>(n / nr_) * block_bytes +
                             nr_ * sizeof(int32_t) + static_cast<size_t>(n % nr_) * kr_;
      for (int64_t k = 0; k < spec_.K; ++k) {
        uint8_t v = block[static_cast<size_t>(k / kr_) * nr_ * kr_ + k % kr_];
        w[n * spec_.K + k] = static_cast<int8_t>(static_cast<int32_t>(v) - 128);
      }
    }
  }

  size_t nbytes_packed() const override {
    std::lock_guard<std::mutex> lock(build_mutex_);
    size_t total = 0;
    for (const auto& s : cache_) total += s->packed_size + s->requant_scales.size() * 4;
    total += (kernel_zero_points_.size() + weight_scales_.size() * 4 + spec_.bias.size() * 4);
    return total;
  }

 private:
  static constexpr size_t kCacheCapacity = 2;

  Buffer allocate() const {
    void* p = nullptr;
    check(posix_memalign(&p, 64, packed_size_) == 0 && p != nullptr, QPACK_STATUS_OUT_OF_MEMORY,
          "could not allocate ", packed_size_, " bytes for QNNPACK packed weights");
    return Buffer(static_cast<uint8_t*>(p));
  }

  std::vector<int32_t> quantize_bias(float input_scale) const {
    return quantize_bias_i32(spec_.bias, spec_.weight_scales, input_scale, spec_.N);
  }

  std::vector<float> requant_scales(float input_scale) const {
    std::vector<float> r(weight_scales_.size(), 1.0f);
    const float inverse_output_scale = 1.0f / spec_.output_scale;
    for (int64_t n = 0; n < spec_.N; ++n) {
      r[n] = (weight_scales_[n] * input_scale) * inverse_output_scale;
      check(r[n] > 0.0f && std::isnormal(r[n]), QPACK_STATUS_INVALID_ARGUMENT,
            "requantization scale weight_scale * input_scale / output_scale = ", r[n],
            " for output channel ", n, " is not a positive normal float; check the scales");
    }
    return r;
  }

  void clamp_f32(float* y, int64_t count) const {
    if (std::isinf(spec_.clamp_min) && std::isinf(spec_.clamp_max)) return;
    for (int64_t i = 0; i < count; ++i) y[i] = std::min(std::max(y[i], spec_.clamp_min), spec_.clamp_max);
  }

  void publish(std::shared_ptr<const State> state) {
    std::lock_guard<std::mutex> lock(build_mutex_);
    cache_.insert(cache_.begin(), state);
    std::atomic_store(&latest_, std::move(state));
    counters_.states_built.fetch_add(1, std::memory_order_relaxed);
  }

  // Lock-free when the latest state matches; otherwise build (copy-on-write
  // from the packed form) under the builders' lock and publish.
  std::shared_ptr<const State> state_for(float input_scale) const {
    auto latest = std::atomic_load(&latest_);
    if (latest->input_scale == input_scale) {
      counters_.cache_hits.fetch_add(1, std::memory_order_relaxed);
      return latest;
    }
    std::lock_guard<std::mutex> lock(build_mutex_);
    for (const auto& s : cache_) {
      if (s->input_scale == input_scale) {
        counters_.cache_hits.fetch_add(1, std::memory_order_relaxed);
        std::atomic_store(&latest_, s);
        return s;
      }
    }
    auto requant = requant_scales(input_scale);  // validates before any allocation
    auto source = cache_.front();
    auto state = std::make_shared<State>();
    state->input_scale = input_scale;
    state->packed = allocate();
    state->packed_size = packed_size_;
    std::memcpy(state->packed.get(), source->packed.get(), packed_size_);
    auto qbias = quantize_bias(input_scale);
    const size_t block_bytes = static_cast<size_t>(nr_) * (sizeof(int32_t) + k_stride_);
    for (int64_t n = 0; n < spec_.N; ++n) {
      uint8_t* slot = state->packed.get() + static_cast<size_t>(n / nr_) * block_bytes +
                      static_cast<size_t>(n % nr_) * sizeof(int32_t);
      std::memcpy(slot, &qbias[n], sizeof(int32_t));
    }
    state->requant_scales = std::move(requant);
    std::shared_ptr<const State> published = std::move(state);
    cache_.insert(cache_.begin(), published);
    // A placeholder packed before the input scale was known is never needed again.
    cache_.erase(std::remove_if(cache_.begin() + 1, cache_.end(),
                                [](const std::shared_ptr<const State>& s) {
                                  return s->input_scale == 0.0f;
                                }),
                 cache_.end());
    while (cache_.size() > kCacheCapacity) {
      cache_.pop_back();
      counters_.evictions.fetch_add(1, std::memory_order_relaxed);
    }
    counters_.states_built.fetch_add(1, std::memory_order_relaxed);
    std::atomic_store(&latest_, published);
    return published;
  }

  LinearSpec spec_;
  uint32_t nr_ = 0, kr_ = 0;
  int64_t n_stride_ = 0, k_stride_ = 0;
  size_t packed_size_ = 0;
  std::vector<uint8_t> kernel_zero_points_;  // padded to n_stride + 8
  std::vector<float> weight_scales_;         // padded to n_stride + 8
  mutable std::shared_ptr<const State> latest_;  // accessed with atomic_load/store only
  mutable std::mutex build_mutex_;               // builders only; guards cache_
  mutable std::vector<std::shared_ptr<const State>> cache_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_qnnpack_linear(const LinearSpec& spec, const void* weight) {
  check(spec.mode != QPACK_MODE_F32, QPACK_STATUS_UNSUPPORTED,
        "QNNPACK has no float32 linear; use backend='onednn'");
  return std::make_unique<QnnpackLinear>(spec, weight);
}

}  // namespace qpack
