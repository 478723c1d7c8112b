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
#include "backends/qnnpack/states.h"
#include "core/error.h"
#include "core/linear.h"
#include "core/quant.h"

namespace qpack {
namespace {

using qnnpack_rt::BiasState;

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
    auto state = std::make_shared<BiasState>();
    state->input_scale = input_scale;
    state->packed = qnnpack_rt::allocate_packed(packed_size_);
    std::memcpy(state->packed.get(), packer.getPackedWeights(), packed_size_);
    if (input_scale > 0.0f) state->requant_scales = requant_scales(input_scale);
    states_.publish_first(std::move(state), packed_size_);
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
    auto state = states_.latest();
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
    auto state = states_.latest();
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
    return states_.nbytes() + kernel_zero_points_.size() + weight_scales_.size() * 4 +
           spec_.bias.size() * 4;
  }

 private:
  std::vector<int32_t> quantize_bias(float input_scale) const {
    return quantize_bias_i32(spec_.bias, spec_.weight_scales, input_scale, spec_.N);
  }

  std::vector<float> requant_scales(float input_scale) const {
    return qnnpack_rt::requant_scales(weight_scales_, spec_.N, input_scale, spec_.output_scale);
  }

  void clamp_f32(float* y, int64_t count) const {
    if (std::isinf(spec_.clamp_min) && std::isinf(spec_.clamp_max)) return;
    for (int64_t i = 0; i < count; ++i) y[i] = std::min(std::max(y[i], spec_.clamp_min), spec_.clamp_max);
  }

  // Byte offset of output channel n's int32 bias: nr of them head each block.
  size_t bias_offset(int64_t n) const {
    const size_t block_bytes = static_cast<size_t>(nr_) * (sizeof(int32_t) + k_stride_);
    return static_cast<size_t>(n / nr_) * block_bytes + static_cast<size_t>(n % nr_) * sizeof(int32_t);
  }

  std::shared_ptr<const BiasState> state_for(float input_scale) const {
    return states_.get(
        input_scale, spec_.N, [this](float s) { return requant_scales(s); },
        [this](float s) { return quantize_bias(s); }, [this](int64_t n) { return bias_offset(n); });
  }

  LinearSpec spec_;
  uint32_t nr_ = 0, kr_ = 0;
  int64_t n_stride_ = 0, k_stride_ = 0;
  size_t packed_size_ = 0;
  std::vector<uint8_t> kernel_zero_points_;  // padded to n_stride + 8
  std::vector<float> weight_scales_;         // padded to n_stride + 8
  qnnpack_rt::BiasStates states_{counters_};
};

}  // namespace

std::unique_ptr<LinearKernel> make_qnnpack_linear(const LinearSpec& spec, const void* weight) {
  check(spec.mode != QPACK_MODE_F32, QPACK_STATUS_UNSUPPORTED,
        "QNNPACK has no float32 linear; use backend='onednn'");
  return std::make_unique<QnnpackLinear>(spec, weight);
}

}  // namespace qpack
