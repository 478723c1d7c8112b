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
#include <cstring>
#include <memory>
#include <vector>

#include "backends/qnnpack/runtime.h"
#include "backends/qnnpack/states.h"
#include "core/error.h"
#include "core/linear.h"
#include "core/quant.h"

namespace qpack {
namespace qnnpack_rt {
namespace {

class QnnpackLinear final : public LinearKernel {
 public:
  QnnpackLinear(const LinearSpec& spec, const void* weight) : QnnpackLinear(spec, nullptr, Loading{}) {
    pack(static_cast<const int8_t*>(weight));
  }

  // Saved packed bytes: used in place when packed for this machine's
  // micro-kernel blocking, else decoded with the saved one and re-packed.
  QnnpackLinear(const LinearSpec& spec, const SavedForm& form)
      : QnnpackLinear(spec, nullptr, Loading{}) {
    const QLayout saved = QLayout::parse(form.layout, form.what);
    const QLayout here = layout(saved.bias_input_scale);
    check(saved.packed_size == form.packed.size && saved.kind == QLayout::linear,
          QPACK_STATUS_FILE_FORMAT, form.what, ": its QNNPACK layout ", saved.str(),
          " does not match its ", form.packed.size, " packed bytes; the file is corrupt "
          "(re-freeze and save it again)");
    if (form.same_build && saved.same_blocking(here)) {
      const float s = spec_.static_int8() ? saved.bias_input_scale : 0.0f;
      states_.publish_first(saved_buffer(form.packed), packed_size_, s,
                            s > 0.0f ? requant(s) : std::vector<float>());
      return;
    }
    layout_differs(form, "saved " + saved.str() + ", QNNPACK wants " + here.str() + " here");
    const int64_t n_stride = (spec_.N + saved.nr - 1) / saved.nr * saved.nr;
    const int64_t k_stride = (spec_.K + saved.kr - 1) / saved.kr * saved.kr;
    check(static_cast<uint64_t>(n_stride) * (k_stride + sizeof(int32_t)) == saved.packed_size,
          QPACK_STATUS_FILE_FORMAT, form.what, ": its QNNPACK layout ", saved.str(),
          " does not fit a [", spec_.N, ", ", spec_.K, "] weight; the file is corrupt");
    std::vector<int8_t> w(static_cast<size_t>(spec_.N * spec_.K));
    decode(form.packed.data, saved.nr, saved.kr, w.data());
    pack(w.data());
  }

  PackedForm packed_form() const override {
    auto state = states_.latest();
    return PackedForm{layout(state->input_scale).bytes(), state->packed.get(), packed_size_, state};
  }

 private:
  struct Loading {};
  QnnpackLinear(const LinearSpec& spec, const void*, Loading)
      : LinearKernel(spec),
        nr_(gemm_nr()),
        kr_(gemm_kr()),
        n_stride_((spec.N + nr_ - 1) / nr_ * nr_),
        k_stride_((spec.K + kr_ - 1) / kr_ * kr_),
        packed_size_(static_cast<size_t>(n_stride_) * (k_stride_ + sizeof(int32_t))),
        wq_(spec, spec.N, n_stride_ + 8) {}

  QLayout layout(float bias_input_scale) const {
    QLayout l;
    l.kind = QLayout::linear;
    l.nr = nr_;
    l.kr = kr_;
    l.packed_size = packed_size_;
    l.bias_input_scale = bias_input_scale;
    return l;
  }

  // Weights [N, K] (int8) of bytes packed with blocking nr x kr.
  void decode(const uint8_t* base, int64_t nr, int64_t kr, int8_t* w) const {
    const int64_t k_stride = (spec_.K + kr - 1) / kr * kr;
    const size_t block_bytes = static_cast<size_t>(nr) * (sizeof(int32_t) + k_stride);
    for (int64_t n = 0; n < spec_.N; ++n) {
      const uint8_t* block = base + static_cast<size_t>(n / nr) * block_bytes +
                             nr * sizeof(int32_t) + static_cast<size_t>(n % nr) * kr;
      for (int64_t k = 0; k < spec_.K; ++k) {
        w[n * spec_.K + k] = from_qnnpack_u8(block[static_cast<size_t>(k / kr) * nr * kr + k % kr]);
      }
    }
  }

  void pack(const int8_t* w) {
    std::vector<uint8_t> shifted(static_cast<size_t>(spec_.N * spec_.K));
    std::transform(w, w + shifted.size(), shifted.begin(), to_qnnpack_u8);
    std::vector<int32_t> qbias;
    float input_scale = 0.0f;
    if (spec_.static_int8() && spec_.input_scale > 0.0f) {
      input_scale = spec_.input_scale;
      qbias = quantize_bias(input_scale);
    }
    // PackBMatrix only validates the requantization scales; the weight scales
    // are valid stand-ins for an unknown input scale.
    qnnpack::PackBMatrix packer(static_cast<size_t>(spec_.K), static_cast<size_t>(spec_.N),
                                wq_.zero_points.data(), wq_.scales.data(), shifted.data(),
                                qbias.empty() ? nullptr : qbias.data());
    states_.publish_first(packer.getPackedWeights(), packed_size_, input_scale,
                          input_scale > 0.0f ? requant(input_scale) : std::vector<float>());
  }


 public:
  void unpack_weight(void* out) const override {
    decode(states_.latest()->packed.get(), nr_, kr_, static_cast<int8_t*>(out));
  }

  size_t nbytes_packed() const override {
    return states_.nbytes() + wq_.nbytes() + spec_.bias.size() * sizeof(float);
  }

 protected:
  void do_run_u8(int64_t M, const uint8_t* x, float input_scale, int32_t input_zero_point,
                 uint8_t* y) const override {
    auto state = state_for(input_scale);
    uint8_t qmin, qmax;
    output_bounds_u8(spec_.clamp_min, spec_.clamp_max, spec_.output_scale,
                     spec_.output_zero_point, &qmin, &qmax);
    auto status = qnnpack::qnnpackLinear(
        static_cast<size_t>(M), static_cast<size_t>(spec_.K), static_cast<size_t>(spec_.N),
        static_cast<uint8_t>(input_zero_point), wq_.zero_points.data(),
        state->requant_scales.data(), static_cast<uint8_t>(spec_.output_zero_point), qmin, qmax,
        x, static_cast<size_t>(spec_.K), state->packed.get(), y, static_cast<size_t>(spec_.N),
        thread_pool());
    check(status == pytorch_qnnp_status_success, QPACK_STATUS_BACKEND_ERROR,
          "qnnpackLinear failed with status ", static_cast<int>(status));
  }

  // Dynamic: the weights' bias slots are unused; the float bias is applied by the kernel.
  void do_run_f32(int64_t M, const float* x, float* y) const override {
    const DynamicInput in = quantize_dynamic(x, M * spec_.K);
    std::vector<float> dequant(wq_.scales.size());
    for (size_t i = 0; i < dequant.size(); ++i) dequant[i] = wq_.scales[i] * in.q.scale;
    std::vector<float> zero_bias;
    const float* bias = spec_.bias.data();
    if (spec_.bias.empty()) {
      zero_bias.assign(static_cast<size_t>(n_stride_), 0.0f);
      bias = zero_bias.data();
    }
    auto state = states_.latest();
    counters_.hit();  // one state serves every input scale
    auto status = qnnpack::qnnpackLinearDynamic(
        static_cast<size_t>(M), static_cast<size_t>(spec_.K), static_cast<size_t>(spec_.N),
        static_cast<uint8_t>(in.q.zero_point), wq_.zero_points.data(), dequant.data(), in.data,
        static_cast<size_t>(spec_.K), state->packed.get(), bias, y,
        static_cast<size_t>(spec_.N), thread_pool());
    check(status == pytorch_qnnp_status_success, QPACK_STATUS_BACKEND_ERROR,
          "qnnpackLinearDynamic failed with status ", static_cast<int>(status));
    clamp_f32(y, M * spec_.N);
  }

 private:
  std::vector<int32_t> quantize_bias(float input_scale) const {
    return quantize_bias_i32(spec_.bias, spec_.weight_scales, input_scale, spec_.N);
  }

  std::vector<float> requant(float input_scale) const {
    return requant_scales(wq_.scales, spec_.N, input_scale, spec_.output_scale);
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
        input_scale, spec_.N, [this](float s) { return requant(s); },
        [this](float s) { return quantize_bias(s); }, [this](int64_t n) { return bias_offset(n); });
  }

  const uint32_t nr_, kr_;
  const int64_t n_stride_, k_stride_;
  const size_t packed_size_;
  const WeightQuant wq_;
  BiasStates states_{counters_};
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const LinearSpec& spec, const void* weight) {
  ensure_initialized();
  return std::make_unique<QnnpackLinear>(spec, weight);
}

std::unique_ptr<LinearKernel> load_linear(const LinearSpec& spec, const SavedForm& form) {
  ensure_initialized();
  return std::make_unique<QnnpackLinear>(spec, form);
}

}  // namespace qnnpack_rt
}  // namespace qpack
