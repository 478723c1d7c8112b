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
// its own operator (conv_operator.h): nothing mutable is shared between threads.
#include <pytorch_qnnpack.h>
#include <qnnpack/params.h>
#include <qnnpack_func.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/qnnpack/conv_operator.h"
#include "backends/qnnpack/nhwc.h"
#include "backends/qnnpack/runtime.h"
#include "backends/qnnpack/states.h"
#include "core/conv.h"
#include "core/error.h"
#include "core/quant.h"

namespace qpack {
namespace qnnpack_rt {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Per-thread scratch for layout copies around the kernel (grows, never shrinks).
uint8_t* thread_scratch(int which, size_t size) {
  // QNNPACK's kernels read up to 7 bytes before a row (and past its end):
  // 16 readable bytes on both sides, as PyTorch's mobile allocator keeps.
  thread_local std::vector<uint8_t> buffers[2];
  if (buffers[which].size() < size + 32) buffers[which].resize(size + 32);
  return buffers[which].data() + 16;
}

class QnnpackConv final : public ConvKernel {
 public:
  QnnpackConv(const ConvSpec& spec, const void* weight)
      : QnnpackConv(spec, gemm_nr(), gemm_kr(), pytorch_qnnp_params.q8dw9.cr) {
    pack(static_cast<const int8_t*>(weight));
  }

  // Saved packed bytes: used in place when packed for this machine's
  // micro-kernel blocking, else decoded with the saved one and re-packed.
  QnnpackConv(const ConvSpec& spec, const SavedForm& form)
      : QnnpackConv(spec, gemm_nr(), gemm_kr(), pytorch_qnnp_params.q8dw9.cr) {
    const QLayout saved = QLayout::parse(form.layout, form.what);
    const QLayout here = layout(saved.bias_input_scale);
    check(saved.packed_size == form.packed.size && saved.kind == here.kind,
          QPACK_STATUS_FILE_FORMAT, form.what, ": its QNNPACK layout ", saved.str(),
          " does not match this convolution (", here.str(), ") or its ", form.packed.size,
          " packed bytes; the file is corrupt (re-freeze and save it again)");
    if (form.same_build && saved.same_blocking(here)) {
      const float s = saved.bias_input_scale;
      states_.publish_first(saved_buffer(form.packed), packed_size_, s,
                            s > 0.0f ? requant(s) : std::vector<float>());
      return;
    }
    layout_differs(form, "saved " + saved.str() + ", QNNPACK wants " + here.str() + " here");
    const QnnpackConv as_saved(spec, saved.nr, saved.kr, saved.cr);
    check(as_saved.packed_size_ == saved.packed_size, QPACK_STATUS_FILE_FORMAT, form.what,
          ": its QNNPACK layout ", saved.str(), " does not fit this convolution; the file is corrupt");
    std::vector<int8_t> w(static_cast<size_t>(spec_.weight_count()));
    as_saved.decode(form.packed.data, w.data());
    pack(w.data());
  }

  PackedForm packed_form() const override {
    auto state = states_.latest();
    return PackedForm{layout(state->input_scale).bytes(), state->packed.get(), packed_size_, state};
  }

  void unpack_weight(void* out) const override {
    decode(states_.latest()->packed.get(), static_cast<int8_t*>(out));
  }

 private:
  // The geometry of a packed layout with blocking nr x kr (gemm, conv) or cr
  // (dwconv); no packed state yet.
  QnnpackConv(const ConvSpec& spec, int64_t nr, int64_t kr, int64_t cr)
      : ConvKernel(spec), layout_(conv_layout(spec)), wq_(spec, spec.OC, round_up(spec.OC, 16) + 16) {
    const int64_t ks = spec_.KH * spec_.KW;
    if (layout_ == ConvLayout::dwconv) {
      cr_ = cr;
      c_stride_ = round_up(spec_.groups, cr_);
      packed_size_ = static_cast<size_t>((ks + 4) * c_stride_);
    } else {
      nr_ = nr;
      kr_ = kr;
      n_stride_ = round_up(spec_.ocg(), nr_);
      k_stride_ = round_up(spec_.icg(), kr_);
      group_bytes_ = static_cast<size_t>((ks * k_stride_ + 4) * n_stride_);
      packed_size_ = group_bytes_ * static_cast<size_t>(spec_.groups);
    }
  }

  QLayout layout(float bias_input_scale) const {
    QLayout l;
    l.kind = layout_ == ConvLayout::dwconv ? QLayout::dwconv
             : layout_ == ConvLayout::gemm ? QLayout::gemm
                                           : QLayout::conv;
    l.nr = static_cast<uint32_t>(nr_);
    l.kr = static_cast<uint32_t>(kr_);
    l.cr = static_cast<uint32_t>(cr_);
    l.packed_size = packed_size_;
    l.bias_input_scale = bias_input_scale;
    return l;
  }

  // Weights [OC, IC/g, KH, KW] (int8) of bytes packed in this geometry.
  void decode(const uint8_t* base, int8_t* w) const {
    const int64_t ks = spec_.KH * spec_.KW, icg = spec_.icg();
    for (int64_t o = 0; o < spec_.OC; ++o) {
      for (int64_t c = 0; c < icg; ++c) {
        for (int64_t k = 0; k < ks; ++k) {
          w[(o * icg + c) * ks + k] = from_qnnpack_u8(base[weight_offset(o, c, k / spec_.KW, k % spec_.KW)]);
        }
      }
    }
  }

  void pack(const int8_t* w) {
    const int64_t ks = spec_.KH * spec_.KW;
    // QNNPACK wants uint8 weights (int8 + 128) in [OC, KH, KW, IC/g].
    const int64_t icg = spec_.icg();
    std::vector<uint8_t> nhwc(static_cast<size_t>(spec_.weight_count()));
    for (int64_t o = 0; o < spec_.OC; ++o) {
      for (int64_t c = 0; c < icg; ++c) {
        for (int64_t k = 0; k < ks; ++k) nhwc[(o * ks + k) * icg + c] = to_qnnpack_u8(w[(o * icg + c) * ks + k]);
      }
    }
    const float input_scale = spec_.input_scale;
    std::vector<int32_t> qbias = quantize_bias(input_scale);
    Operator op = make_conv_operator(spec_, layout_, 0, 0, 0, 0);
    qnnpack::PrePackConvWeights packer(op.get(), wq_.zero_points.data(), nhwc.data(), qbias.data());
    states_.publish_first(packer.getPackedWeights(), packed_size_, input_scale,
                          input_scale > 0.0f ? requant(input_scale) : std::vector<float>());
  }

 public:
  size_t nbytes_packed() const override {
    return states_.nbytes() + wq_.nbytes() + spec_.bias.size() * sizeof(float);
  }

 protected:
  void do_run_u8(const ConvShape& s, const uint8_t* x, float input_scale, int32_t input_zero_point,
                 uint8_t* y) const override {
    auto state = state_for(input_scale);
    // Symmetric padding for QNNPACK; asymmetric padding (stride 1 there) is
    // the larger symmetric one with the extra leading output row/column cropped.
    const int64_t ph = std::max(spec_.pad_t, spec_.pad_b), pw = std::max(spec_.pad_l, spec_.pad_r);
    const int64_t dy = ph - spec_.pad_t, dx = pw - spec_.pad_l;
    const int64_t bh = (s.H + 2 * ph - spec_.dil_h * (spec_.KH - 1) - 1) / spec_.stride_h + 1;
    const int64_t bw = (s.W + 2 * pw - spec_.dil_w * (spec_.KW - 1) - 1) / spec_.stride_w + 1;
    const uint8_t* x_nhwc = x;
    if (s.x_layout == QPACK_LAYOUT_NCHW) {
      uint8_t* tmp = thread_scratch(0, static_cast<size_t>(s.N * spec_.IC * s.H * s.W));
      nchw_to_nhwc_u8(x, s.N, spec_.IC, s.H * s.W, tmp);
      x_nhwc = tmp;
    }
    const bool direct = s.y_layout == QPACK_LAYOUT_NHWC && bh == s.OH && bw == s.OW;
    uint8_t* y_nhwc = direct ? y : thread_scratch(1, static_cast<size_t>(s.N * bh * bw * spec_.OC));

    uint8_t qmin, qmax;
    output_bounds_u8(spec_.clamp_min, spec_.clamp_max, spec_.output_scale,
                     spec_.output_zero_point, &qmin, &qmax);
    const int64_t zero_size = layout_ == ConvLayout::dwconv ? c_stride_ : k_stride_;
    Operator op = make_conv_operator(spec_, layout_, static_cast<uint8_t>(input_zero_point), ph,
                                     pw, zero_size);
    auto status = qnnpack::qnnpackConv(
        op.get(), state->packed.get(), static_cast<size_t>(s.N), 1, static_cast<size_t>(s.H),
        static_cast<size_t>(s.W), static_cast<uint8_t>(input_zero_point), x_nhwc,
        wq_.zero_points.data(), state->requant_scales.data(),
        static_cast<uint8_t>(spec_.output_zero_point), qmin, qmax, y_nhwc, thread_pool());
    check(status == pytorch_qnnp_status_success, QPACK_STATUS_BACKEND_ERROR,
          "qnnpackConv failed with status ", static_cast<int>(status));
    if (!direct) copy_nhwc_u8(y_nhwc, s.N, bh, bw, spec_.OC, dy, dx, s.OH, s.OW, s.y_layout, y);
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
    if (layout_ == ConvLayout::dwconv) {
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
    if (layout_ == ConvLayout::dwconv) {
      const int64_t first_pass_taps = (spec_.KW == 5 ? 2 : spec_.KW) * spec_.KH;
      return static_cast<size_t>((o / cr_) * cr_ * (4 + first_pass_taps) + (o % cr_) * 4);
    }
    const int64_t g = o / spec_.ocg(), n = o % spec_.ocg(), ks = spec_.KH * spec_.KW;
    return g * group_bytes_ +
           static_cast<size_t>((n / nr_) * nr_ * (4 + ks * k_stride_) + (n % nr_) * 4);
  }

  // ---- bias and scales ---------------------------------------------------------

  std::vector<int32_t> quantize_bias(float input_scale) const {
    if (input_scale <= 0.0f) return std::vector<int32_t>(static_cast<size_t>(spec_.OC), 0);
    return quantize_bias_i32(spec_.bias, spec_.weight_scales, input_scale, spec_.OC);
  }

  std::vector<float> requant(float input_scale) const {
    return requant_scales(wq_.scales, spec_.OC, input_scale, spec_.output_scale);
  }

  std::shared_ptr<const BiasState> state_for(float input_scale) const {
    return states_.get(
        input_scale, spec_.OC, [this](float s) { return requant(s); },
        [this](float s) { return quantize_bias(s); }, [this](int64_t n) { return bias_offset(n); });
  }

  const ConvLayout layout_;
  const WeightQuant wq_;
  int64_t cr_ = 0, c_stride_ = 0;                          // dwconv
  int64_t nr_ = 0, kr_ = 0, n_stride_ = 0, k_stride_ = 0;  // gemm / conv
  size_t group_bytes_ = 0, packed_size_ = 0;
  BiasStates states_{counters_};
};


void check_padding(const ConvSpec& spec) {
  check((spec.pad_t == spec.pad_b || spec.stride_h == 1) &&
            (spec.pad_l == spec.pad_r || spec.stride_w == 1),
        QPACK_STATUS_UNSUPPORTED,
        "QNNPACK needs symmetric padding, or stride 1 where the padding is asymmetric; "
        "use backend='onednn'");
}

}  // namespace

std::unique_ptr<ConvKernel> make_conv(const ConvSpec& spec, const void* weight) {
  check_padding(spec);
  ensure_initialized();
  return std::make_unique<QnnpackConv>(spec, weight);
}

std::unique_ptr<ConvKernel> load_conv(const ConvSpec& spec, const SavedForm& form) {
  check_padding(spec);
  ensure_initialized();
  return std::make_unique<QnnpackConv>(spec, form);
}

}  // namespace qnnpack_rt
}  // namespace qpack
