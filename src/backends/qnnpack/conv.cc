// QNNPACK convolution: static quint8 (PrePackConvWeights + qnnpackConv), NHWC.
//
// QNNPACK picks one of three packed layouts, as PyTorch's prepack does:
//   - dwconv (depthwise 3x3 and 5x5): for each block of cr channels, int32
//     bias[cr] then the taps, cr bytes per tap, column-major over the kernel
//     (x outer, y inner). 5x5 is packed in three passes over columns
//     [0, 2), [2, 4), [4, 5); only the first pass carries the bias.
//   - gemm (1x1, stride 1, no padding) and conv (everything else): per group,
//     for each block of nr output channels, int32 bias[nr] then, for each tap
//     and each block of kr input channels, nr x kr bytes.
// Weights are uint8 = int8 + 128 and invertible; the int32 bias is not, so
// the float bias is kept (OC floats) to re-pack for a new input scale from the
// packed form (copy-on-write, published atomically). QNNPACK's operator holds
// per-run mutable state (indirection buffer, zero buffer), so each run builds
// its own operator: nothing mutable is shared between threads.
#include <pytorch_qnnpack.h>
#include <qnnpack/operator.h>
#include <qnnpack/params.h>
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
#include "core/conv.h"
#include "core/error.h"
#include "core/quant.h"

namespace qpack {
namespace {

struct OpDeleter {
  void operator()(pytorch_qnnp_operator_t op) const { pytorch_qnnp_delete_operator(op); }
};
using Op = std::unique_ptr<pytorch_qnnp_operator, OpDeleter>;

using qnnpack_rt::BiasState;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

class QnnpackConv final : public ConvKernel {
 public:
  QnnpackConv(const ConvSpec& spec, const void* weight) : spec_(spec) {
    qnnpack_rt::ensure_initialized();
    const int64_t ks = spec_.KH * spec_.KW;
    const bool depthwise_dims = (spec_.KH == 3 && spec_.KW == 3) || (spec_.KH == 5 && spec_.KW == 5);
    const bool any_padding = spec_.pad_t || spec_.pad_l || spec_.pad_b || spec_.pad_r;
    if (depthwise_dims && spec_.icg() == 1 && spec_.ocg() == 1 && spec_.groups > 1) {
      type_ = pytorch_qnnp_ukernel_type_dwconv;
    } else if (ks == 1 && spec_.stride_h == 1 && spec_.stride_w == 1 && !any_padding) {
      type_ = pytorch_qnnp_ukernel_type_gemm;
    } else {
      type_ = pytorch_qnnp_ukernel_type_conv;
    }
    if (type_ == pytorch_qnnp_ukernel_type_dwconv) {
      cr_ = pytorch_qnnp_params.q8dw9.cr;
      c_stride_ = round_up(spec_.groups, cr_);
      packed_size_ = static_cast<size_t>((ks + 4) * c_stride_);
    } else {
      nr_ = pytorch_qnnp_params.q8conv.nr;
      kr_ = pytorch_qnnp_params.q8conv.kr;
      n_stride_ = round_up(spec_.ocg(), nr_);
      k_stride_ = round_up(spec_.icg(), kr_);
      group_bytes_ = static_cast<size_t>((ks * k_stride_ + 4) * n_stride_);
      packed_size_ = group_bytes_ * static_cast<size_t>(spec_.groups);
    }
    const int64_t padded = round_up(spec_.OC, 16) + 16;
    kernel_zero_points_.assign(padded, 128);
    weight_scales_.assign(padded, 1.0f);
    for (int64_t n = 0; n < spec_.OC; ++n) {
      kernel_zero_points_[n] = static_cast<uint8_t>(spec_.weight_zero_point(n) + 128);
      weight_scales_[n] = spec_.weight_scale(n);
    }

    // QNNPACK wants uint8 weights (int8 + 128) in [OC, KH, KW, IC/g].
    const int8_t* w = static_cast<const int8_t*>(weight);
    const int64_t icg = spec_.icg();
    std::vector<uint8_t> nhwc(static_cast<size_t>(spec_.weight_count()));
    for (int64_t o = 0; o < spec_.OC; ++o) {
      for (int64_t c = 0; c < icg; ++c) {
        for (int64_t k = 0; k < ks; ++k) {
          nhwc[(o * ks + k) * icg + c] =
              static_cast<uint8_t>(static_cast<int32_t>(w[(o * icg + c) * ks + k]) + 128);
        }
      }
    }
    float input_scale = spec_.input_scale;
    std::vector<int32_t> qbias = quantize_bias(input_scale);
    Op op = make_op(0);
    qnnpack::PrePackConvWeights packer(op.get(), kernel_zero_points_.data(), nhwc.data(),
                                       qbias.data());
    check(packer.getPackedWeights() != nullptr, QPACK_STATUS_OUT_OF_MEMORY,
          "QNNPACK could not allocate ", packed_size_, " bytes for packed weights");
    auto state = std::make_shared<BiasState>();
    state->input_scale = input_scale;
    state->packed = qnnpack_rt::allocate_packed(packed_size_);
    std::memcpy(state->packed.get(), packer.getPackedWeights(), packed_size_);
    if (input_scale > 0.0f) state->requant_scales = requant_scales(input_scale);
    states_.publish_first(std::move(state), packed_size_);
  }

  void run_u8(const ConvShape& s, const uint8_t* x, float input_scale, int32_t input_zero_point,
              uint8_t* y) const override {
    if (spec_.mode != QPACK_MODE_INT8_STATIC) ConvKernel::run_u8(s, x, 0, 0, y);
    check_scale(input_scale, "input scale", -1);
    check_u8_zero_point(input_zero_point, "input zero point");
    auto state = state_for(input_scale);
    counters_.runs.fetch_add(1, std::memory_order_relaxed);
    if (s.N == 0) return;

    // Symmetric padding for QNNPACK; asymmetric padding (stride 1 there) is
    // the larger symmetric one with the extra leading output row/column cropped.
    const int64_t ph = std::max(spec_.pad_t, spec_.pad_b), pw = std::max(spec_.pad_l, spec_.pad_r);
    const int64_t dy = ph - spec_.pad_t, dx = pw - spec_.pad_l;
    const int64_t bh = (s.H + 2 * ph - spec_.dil_h * (spec_.KH - 1) - 1) / spec_.stride_h + 1;
    const int64_t bw = (s.W + 2 * pw - spec_.dil_w * (spec_.KW - 1) - 1) / spec_.stride_w + 1;
    std::vector<uint8_t> x_tmp, y_tmp;
    const uint8_t* x_nhwc = x;
    if (s.x_layout == QPACK_LAYOUT_NCHW) {
      x_tmp.resize(static_cast<size_t>(s.N * spec_.IC * s.H * s.W));
      nchw_to_nhwc(x, s.N, spec_.IC, s.H * s.W, x_tmp.data());
      x_nhwc = x_tmp.data();
    }
    const bool direct = s.y_layout == QPACK_LAYOUT_NHWC && bh == s.OH && bw == s.OW;
    uint8_t* y_nhwc = y;
    if (!direct) {
      y_tmp.resize(static_cast<size_t>(s.N * bh * bw * spec_.OC));
      y_nhwc = y_tmp.data();
    }

    uint8_t qmin, qmax;
    output_bounds_u8(spec_.clamp_min, spec_.clamp_max, spec_.output_scale,
                     spec_.output_zero_point, &qmin, &qmax);
    Op op = make_op(static_cast<uint8_t>(input_zero_point), ph, pw);
    auto status = qnnpack::qnnpackConv(
        op.get(), state->packed.get(), static_cast<size_t>(s.N), 1, static_cast<size_t>(s.H),
        static_cast<size_t>(s.W), static_cast<uint8_t>(input_zero_point), x_nhwc,
        kernel_zero_points_.data(), state->requant_scales.data(),
        static_cast<uint8_t>(spec_.output_zero_point), qmin, qmax, y_nhwc,
        qnnpack_rt::thread_pool());
    check(status == pytorch_qnnp_status_success, QPACK_STATUS_BACKEND_ERROR,
          "qnnpackConv failed with status ", static_cast<int>(status));
    if (!direct) copy_nhwc_u8(y_nhwc, s.N, bh, bw, spec_.OC, dy, dx, s.OH, s.OW, s.y_layout, y);
  }

  void unpack_weight(void* out) const override {
    auto state = states_.latest();
    const uint8_t* base = state->packed.get();
    int8_t* w = static_cast<int8_t*>(out);
    const int64_t ks = spec_.KH * spec_.KW, icg = spec_.icg();
    for (int64_t o = 0; o < spec_.OC; ++o) {
      for (int64_t c = 0; c < icg; ++c) {
        for (int64_t k = 0; k < ks; ++k) {
          const uint8_t v = base[weight_offset(o, c, k / spec_.KW, k % spec_.KW)];
          w[(o * icg + c) * ks + k] = static_cast<int8_t>(static_cast<int32_t>(v) - 128);
        }
      }
    }
  }

  size_t nbytes_packed() const override {
    return states_.nbytes() + kernel_zero_points_.size() + weight_scales_.size() * 4 +
           spec_.bias.size() * 4;
  }

 private:
  // ---- the packed layouts ---------------------------------------------------

  // dwconv column passes: [x_begin, x_end) per pass (5x5 is packed in three).
  int dw_passes(int64_t* begin, int64_t* end) const {
    if (spec_.KW == 5) {
      const int64_t b[3] = {0, 2, 4}, e[3] = {2, 4, 5};
      std::copy(b, b + 3, begin);
      std::copy(e, e + 3, end);
      return 3;
    }
    begin[0] = 0;
    end[0] = spec_.KW;
    return 1;
  }

  // Byte offset of weight (output channel o, input channel c of its group, tap y, x).
  size_t weight_offset(int64_t o, int64_t c, int64_t y, int64_t x) const {
    if (type_ == pytorch_qnnp_ukernel_type_dwconv) {
      int64_t begin[3], end[3];
      const int passes = dw_passes(begin, end);
      int64_t base = 0;
      for (int p = 0; p < passes; ++p) {
        const int64_t taps = (end[p] - begin[p]) * spec_.KH, head = p == 0 ? 4 : 0;
        if (x < end[p]) {
          return static_cast<size_t>(base + (o / cr_) * cr_ * (head + taps) + head * cr_ +
                                     ((x - begin[p]) * spec_.KH + y) * cr_ + o % cr_);
        }
        base += (head + taps) * c_stride_;
      }
      fail(QPACK_STATUS_INTERNAL, "tap outside the depthwise kernel");
    }
    const int64_t g = o / spec_.ocg(), n = o % spec_.ocg(), ks = spec_.KH * spec_.KW;
    const int64_t k = y * spec_.KW + x;
    return g * group_bytes_ +
           static_cast<size_t>((n / nr_) * nr_ * (4 + ks * k_stride_) + 4 * nr_ +
                               k * k_stride_ * nr_ + (c / kr_) * nr_ * kr_ + (n % nr_) * kr_ +
                               c % kr_);
  }

  // Byte offset of output channel o's int32 bias.
  size_t bias_offset(int64_t o) const {
    if (type_ == pytorch_qnnp_ukernel_type_dwconv) {
      const int64_t first_pass_taps = (spec_.KW == 5 ? 2 : spec_.KW) * spec_.KH;
      return static_cast<size_t>((o / cr_) * cr_ * (4 + first_pass_taps) + (o % cr_) * 4);
    }
    const int64_t g = o / spec_.ocg(), n = o % spec_.ocg(), ks = spec_.KH * spec_.KW;
    return g * group_bytes_ +
           static_cast<size_t>((n / nr_) * nr_ * (4 + ks * k_stride_) + (n % nr_) * 4);
  }

  // ---- operator, bias and scales ---------------------------------------------

  // An operator describing this convolution, as PyTorch's prepack builds it.
  // With padding it carries a zero buffer filled with the input zero point.
  Op make_op(uint8_t input_zero_point, int64_t pad_h = 0, int64_t pad_w = 0) const {
    auto* raw = static_cast<pytorch_qnnp_operator_t>(calloc(1, sizeof(pytorch_qnnp_operator)));
    check(raw != nullptr, QPACK_STATUS_OUT_OF_MEMORY, "could not allocate a QNNPACK operator");
    Op op(raw);
    op->ukernel_type = type_;
    op->groups = static_cast<uint32_t>(spec_.groups);
    op->group_input_channels = static_cast<size_t>(spec_.icg());
    op->group_output_channels = static_cast<size_t>(spec_.ocg());
    op->kernel_depth = 1;
    op->kernel_height = static_cast<uint32_t>(spec_.KH);
    op->kernel_width = static_cast<uint32_t>(spec_.KW);
    op->stride_depth = 1;
    op->stride_height = static_cast<uint32_t>(spec_.stride_h);
    op->stride_width = static_cast<uint32_t>(spec_.stride_w);
    op->dilation_depth = 1;
    op->dilation_height = static_cast<uint32_t>(spec_.dil_h);
    op->dilation_width = static_cast<uint32_t>(spec_.dil_w);
    op->input_padding_depth = 0;
    op->input_padding_height = static_cast<uint32_t>(pad_h);
    op->input_padding_width = static_cast<uint32_t>(pad_w);
    op->per_channel = spec_.per_channel();
    op->transpose = false;
    if (pad_h != 0 || pad_w != 0) {
      size_t zero_size, zero_offset = 0;
      if (type_ == pytorch_qnnp_ukernel_type_dwconv) {
        zero_size = static_cast<size_t>(c_stride_);
        if (spec_.groups < 8) zero_offset = 8;
      } else {
        zero_size = static_cast<size_t>(k_stride_);
        if (spec_.icg() < 8) zero_offset = 8;
      }
      zero_size += zero_offset;
      void* zero = std::malloc(zero_size);
      check(zero != nullptr, QPACK_STATUS_OUT_OF_MEMORY, "could not allocate a zero buffer");
      std::memset(zero, input_zero_point, zero_size);
      op->zero_buffer = zero;
      op->zero_pointer = static_cast<uint8_t*>(zero) + zero_offset;
    }
    return op;
  }

  std::vector<int32_t> quantize_bias(float input_scale) const {
    if (input_scale <= 0.0f) return std::vector<int32_t>(static_cast<size_t>(spec_.OC), 0);
    return quantize_bias_i32(spec_.bias, spec_.weight_scales, input_scale, spec_.OC);
  }

  std::vector<float> requant_scales(float input_scale) const {
    return qnnpack_rt::requant_scales(weight_scales_, spec_.OC, input_scale, spec_.output_scale);
  }

  static void nchw_to_nhwc(const uint8_t* x, int64_t N, int64_t C, int64_t HW, uint8_t* out) {
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* src = x + n * C * HW;
      uint8_t* dst = out + n * C * HW;
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t p = 0; p < HW; ++p) dst[p * C + c] = src[c * HW + p];
      }
    }
  }

  std::shared_ptr<const BiasState> state_for(float input_scale) const {
    return states_.get(
        input_scale, spec_.OC, [this](float s) { return requant_scales(s); },
        [this](float s) { return quantize_bias(s); }, [this](int64_t n) { return bias_offset(n); });
  }

  ConvSpec spec_;
  pytorch_qnnp_ukernel_type type_ = pytorch_qnnp_ukernel_type_none;
  int64_t cr_ = 0, c_stride_ = 0;                // dwconv
  int64_t nr_ = 0, kr_ = 0, n_stride_ = 0, k_stride_ = 0;  // gemm / conv
  size_t group_bytes_ = 0, packed_size_ = 0;
  std::vector<uint8_t> kernel_zero_points_;  // padded
  std::vector<float> weight_scales_;         // padded
  qnnpack_rt::BiasStates states_{counters_};
};

}  // namespace

std::unique_ptr<ConvKernel> make_qnnpack_conv(const ConvSpec& spec, const void* weight) {
  check(spec.mode == QPACK_MODE_INT8_STATIC, QPACK_STATUS_UNSUPPORTED,
        "QNNPACK convolution is static int8 only; use backend='onednn'");
  return std::make_unique<QnnpackConv>(spec, weight);
}

}  // namespace qpack
