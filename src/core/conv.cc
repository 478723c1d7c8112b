#include "core/conv.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/layer.h"
#include "core/quant.h"

namespace qpack {

void ConvKernel::run_f32(const ConvShape&, const float*, float*) const {
  fail(QPACK_STATUS_INVALID_TYPE,
       "this convolution takes uint8 input with a scale and zero point (it is a static int8 "
       "layer); float input needs a float32 layer");
}

void ConvKernel::run_u8(const ConvShape&, const uint8_t*, float, int32_t, uint8_t*) const {
  fail(QPACK_STATUS_INVALID_TYPE,
       "this convolution takes float32 input; uint8 input needs a static int8 layer "
       "(int8 weight with output_scale and output_zero_point)");
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

ConvSpec make_conv_spec(const qpack_conv2d_params& p) {
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
  check(in_range(p.kernel_h, 1, 4096) && in_range(p.kernel_w, 1, 4096),
        QPACK_STATUS_INVALID_ARGUMENT, "kernel size must be in [1, 4096], got ", p.kernel_h, "x",
        p.kernel_w);
  check(in_range(p.stride_h, 1, 4096) && in_range(p.stride_w, 1, 4096),
        QPACK_STATUS_INVALID_ARGUMENT, "stride must be in [1, 4096], got ", p.stride_h, "x",
        p.stride_w);
  check(in_range(p.dilation_h, 1, 4096) && in_range(p.dilation_w, 1, 4096),
        QPACK_STATUS_INVALID_ARGUMENT, "dilation must be in [1, 4096], got ", p.dilation_h, "x",
        p.dilation_w);
  check(in_range(p.pad_top, 0, 65536) && in_range(p.pad_left, 0, 65536) &&
            in_range(p.pad_bottom, 0, 65536) && in_range(p.pad_right, 0, 65536),
        QPACK_STATUS_INVALID_ARGUMENT, "padding must be in [0, 65536]");
  check(p.weight != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "weight is NULL");
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

  check(p.mode == QPACK_MODE_F32 || p.mode == QPACK_MODE_INT8_STATIC,
        p.mode == QPACK_MODE_INT8_DYNAMIC ? QPACK_STATUS_UNSUPPORTED
                                          : QPACK_STATUS_INVALID_ARGUMENT,
        "convolution supports float32 and static int8 modes, got mode ",
        static_cast<int>(p.mode));
  s.mode = p.mode;
  s.backend = p.backend;
  if (s.backend == QPACK_BACKEND_AUTO) {
    s.backend = s.mode == QPACK_MODE_F32 ? QPACK_BACKEND_ONEDNN : QPACK_BACKEND_QNNPACK;
  }
  check(s.backend == QPACK_BACKEND_ONEDNN || s.backend == QPACK_BACKEND_QNNPACK,
        QPACK_STATUS_INVALID_ARGUMENT, "unknown backend ", static_cast<int>(p.backend));
  check(!(s.mode == QPACK_MODE_F32 && s.backend == QPACK_BACKEND_QNNPACK),
        QPACK_STATUS_UNSUPPORTED,
        "QNNPACK has no float32 convolution; use backend='onednn' or quantize the weight to int8");
  if (s.backend == QPACK_BACKEND_QNNPACK) {
    check((s.pad_t == s.pad_b || s.stride_h == 1) && (s.pad_l == s.pad_r || s.stride_w == 1),
          QPACK_STATUS_UNSUPPORTED,
          "QNNPACK needs symmetric padding, or stride 1 where the padding is asymmetric; "
          "use backend='onednn'");
  }

  parse_clamp(p.clamp_min, p.clamp_max, &s.clamp_min, &s.clamp_max);
  s.bias = parse_bias(p.bias, s.OC);

  if (s.mode == QPACK_MODE_INT8_STATIC) {
    parse_weight_quant(p.weight_scales, p.weight_zero_points, p.num_weight_scales, s.OC,
                       "channel", &s.weight_scales, &s.weight_zero_points);
    parse_static_io(p.input_scale, p.input_zero_point, p.output_scale, p.output_zero_point,
                    &s.input_scale, &s.input_zero_point, &s.output_scale, &s.output_zero_point);
  }
  return s;
}

Conv::Conv(ConvSpec spec, const void* weight, bool retain) : spec_(std::move(spec)) {
  if (spec_.backend == QPACK_BACKEND_ONEDNN) {
    kernel_ = make_onednn_conv(spec_, weight);
  } else {
    kernel_ = make_qnnpack_conv(spec_, weight);
  }
  if (retain) original_.keep(weight, spec_.weight_nbytes());
}

void Conv::release_original() { original_.release(); }
bool Conv::has_original() const { return original_.held(); }
size_t Conv::nbytes_original() const { return original_.nbytes(); }

void Conv::unpack(void* weight_out, float* bias_out) const {
  if (weight_out != nullptr && !original_.copy_to(weight_out)) kernel_->unpack_weight(weight_out);
  if (bias_out != nullptr) copy_bias(spec_.bias, spec_.OC, bias_out);
}

void copy_nhwc_u8(const uint8_t* src, int64_t N, int64_t SH, int64_t SW, int64_t C, int64_t dy,
                  int64_t dx, int64_t OH, int64_t OW, qpack_layout layout, uint8_t* dst) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < OH; ++h) {
      const uint8_t* row = src + ((n * SH + h + dy) * SW + dx) * C;
      if (layout == QPACK_LAYOUT_NHWC) {
        std::memcpy(dst + (n * OH + h) * OW * C, row, static_cast<size_t>(OW * C));
        continue;
      }
      for (int64_t w = 0; w < OW; ++w) {
        for (int64_t c = 0; c < C; ++c) dst[((n * C + c) * OH + h) * OW + w] = row[w * C + c];
      }
    }
  }
}

}  // namespace qpack
