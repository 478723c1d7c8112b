#include "core/conv.h"

#include "core/error.h"

namespace qpack {

void ConvKernel::run_f32(const ConvShape& s, const float* x, float* y) const {
  check_run_mode(spec_, OpKind::conv2d, false);
  check(fuses_f32(s.post_act), QPACK_STATUS_INVALID_ARGUMENT, "this convolution cannot apply activation ",
        static_cast<int>(s.post_act), " after itself");
  check(!s.sum || fuses_sum(s), QPACK_STATUS_INVALID_ARGUMENT,
        "this convolution cannot add its output to the destination's values for this shape");
  counters_.ran();
  if (s.N > 0) do_run_f32(s, x, y);
}

void ConvKernel::run_u8(const ConvShape& s, const uint8_t* x, float input_scale,
                        int32_t input_zero_point, uint8_t* y) const {
  check_run_mode(spec_, OpKind::conv2d, true);
  check_input_qparams(input_scale, input_zero_point);
  check(!s.sum || fuses_sum(s), QPACK_STATUS_INVALID_ARGUMENT,
        "this convolution cannot add its output to the destination's values for this shape");
  counters_.ran();
  if (s.N > 0) do_run_u8(s, x, input_scale, input_zero_point, y);
}

void ConvKernel::do_run_f32(const ConvShape&, const float*, float*) const {
  not_run(spec_, OpKind::conv2d);
}
void ConvKernel::do_run_u8(const ConvShape&, const uint8_t*, float, int32_t, uint8_t*) const {
  not_run(spec_, OpKind::conv2d);
}

void ConvSpec::output_size(int64_t H, int64_t W, int64_t* OH, int64_t* OW) const {
  check(H >= 1 && W >= 1, QPACK_STATUS_INVALID_ARGUMENT, "input height and width must be >= 1, got ",
        H, "x", W);
  const int64_t kh = dil_h * (KH - 1) + 1, kw = dil_w * (KW - 1) + 1;
  const int64_t ph = H + pad_t + pad_b, pw = W + pad_l + pad_r;
  check(ph >= kh && pw >= kw, QPACK_STATUS_INVALID_ARGUMENT, "the padded input (", ph, "x", pw,
        ") is smaller than the dilated kernel (", kh, "x", kw,
        "); use a larger input or more padding");
  *OH = (ph - kh) / stride_h + 1;
  *OW = (pw - kw) / stride_w + 1;
}

ConvSpec make_conv_spec(const qpack_conv2d_params& p, bool weight_given) {
  ConvSpec s;
  constexpr int64_t kMaxDim = int64_t(1) << 24;
  auto in_range = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  check(in_range(p.groups, 1, kMaxDim), QPACK_STATUS_INVALID_ARGUMENT,
        "groups must be >= 1, got ", p.groups);
  check(in_range(p.in_channels, 1, kMaxDim) && in_range(p.out_channels, 1, kMaxDim),
        QPACK_STATUS_INVALID_ARGUMENT, "in_channels and out_channels must be in [1, 2^24], got ",
        p.in_channels, " and ", p.out_channels);
  check(p.in_channels % p.groups == 0 && p.out_channels % p.groups == 0,
        QPACK_STATUS_INVALID_ARGUMENT, "groups (", p.groups,
        ") must divide in_channels (", p.in_channels, ") and out_channels (", p.out_channels, ")");
  auto check_pair = [&](const char* what, int64_t h, int64_t w) {
    check(in_range(h, 1, 4096) && in_range(w, 1, 4096), QPACK_STATUS_INVALID_ARGUMENT, what,
          " must be in [1, 4096], got ", h, "x", w);
  };
  check_pair("kernel size", p.kernel_h, p.kernel_w);
  check_pair("stride", p.stride_h, p.stride_w);
  check_pair("dilation", p.dilation_h, p.dilation_w);
  check(in_range(p.pad_top, 0, 65536) && in_range(p.pad_left, 0, 65536) &&
            in_range(p.pad_bottom, 0, 65536) && in_range(p.pad_right, 0, 65536),
        QPACK_STATUS_INVALID_ARGUMENT, "padding must be in [0, 65536]");
  s.IC = p.in_channels;
  s.OC = p.out_channels;
  s.groups = p.groups;
  s.KH = p.kernel_h;
  s.KW = p.kernel_w;
  s.stride_h = p.stride_h;
  s.stride_w = p.stride_w;
  s.pad_t = p.pad_top;
  s.pad_l = p.pad_left;
  s.pad_b = p.pad_bottom;
  s.pad_r = p.pad_right;
  s.dil_h = p.dilation_h;
  s.dil_w = p.dilation_w;
  check(s.weight_count() < (int64_t(1) << 31), QPACK_STATUS_INVALID_ARGUMENT,
        "the weight has more than 2^31 elements");

  parse_op_spec(OpParams::of(p), OpKind::conv2d, p.weight, s.weight_count(), s.OC, "channel", &s,
                weight_given);
  return s;
}

}  // namespace qpack
