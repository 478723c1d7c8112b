// extern "C" surface of the packed conv2d (qpack_conv2d_*). Same conventions
// as the linear layer (api/handle.h).
#include <cmath>
#include <cstring>

#include "api/handle.h"
#include "core/conv.h"
#include "core/error.h"
#include "qpack/qpack.h"

namespace qpack {
void fill_geometry(const ConvSpec& s, qpack_conv2d_info* out) {
  out->in_channels = s.IC;
  out->out_channels = s.OC;
  out->groups = s.groups;
  out->kernel_h = s.KH;
  out->kernel_w = s.KW;
}
}  // namespace qpack

namespace {
namespace api = qpack::api;
constexpr const char* kWhat = "convolution";

// Checks a run's arguments into its geometry, then runs body(kernel, shape).
template <typename In, typename Out, typename Run>
qpack_status run(const qpack_conv2d* conv, int64_t batch, int64_t height, int64_t width,
                 qpack_layout x_layout, const In* x, qpack_layout y_layout, Out* y, Run body) {
  return api::guarded([&] {
    auto impl = api::live(conv, kWhat);
    const qpack::ConvSpec& spec = impl->spec();
    api::check_batch_io(batch, x, y);
    auto valid = [](qpack_layout l) { return l == QPACK_LAYOUT_NCHW || l == QPACK_LAYOUT_NHWC; };
    qpack::check(valid(x_layout) && valid(y_layout), QPACK_STATUS_INVALID_ARGUMENT,
                 "layout must be QPACK_LAYOUT_NCHW or QPACK_LAYOUT_NHWC");
    qpack::ConvShape s{batch, height, width, 0, 0, x_layout, y_layout};
    spec.output_size(height, width, &s.OH, &s.OW);
    const int64_t limit = int64_t(1) << 40;
    qpack::check(height < limit / width && batch < limit / (height * width * spec.IC + 1) &&
                     batch < limit / (s.OH * s.OW * spec.OC + 1),
                 QPACK_STATUS_INVALID_ARGUMENT, "input or output is too large");
    body(impl->kernel(), s);
  });
}
}  // namespace

extern "C" {

void qpack_conv2d_params_init(qpack_conv2d_params* params) {
  if (params == nullptr) return;
  std::memset(params, 0, sizeof(*params));
  params->groups = 1;
  params->kernel_h = params->kernel_w = 1;
  params->stride_h = params->stride_w = 1;
  params->dilation_h = params->dilation_w = 1;
  params->mode = QPACK_MODE_F32;
  params->backend = QPACK_BACKEND_AUTO;
  params->retain = QPACK_RETAIN_DEFAULT;
  params->clamp_min = -INFINITY;
  params->clamp_max = INFINITY;
}

qpack_status qpack_conv2d_create(const qpack_conv2d_params* params, qpack_conv2d** conv_out) {
  return api::create(params, conv_out, [](const qpack_conv2d_params& p) { return qpack::make_conv_spec(p); });
}

void qpack_conv2d_destroy(qpack_conv2d* conv) { delete conv; }

qpack_status qpack_conv2d_close(qpack_conv2d* conv) { return api::close(conv, kWhat); }

qpack_status qpack_conv2d_output_size(const qpack_conv2d* conv, int64_t height, int64_t width,
                                      int64_t* out_h_out, int64_t* out_w_out) {
  return api::guarded([&] {
    qpack::check(out_h_out != nullptr && out_w_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "out_h_out or out_w_out is NULL");
    api::live(conv, kWhat)->spec().output_size(height, width, out_h_out, out_w_out);
  });
}

qpack_status qpack_conv2d_run_f32(const qpack_conv2d* conv, int64_t batch, int64_t height,
                                  int64_t width, qpack_layout x_layout, const float* x,
                                  qpack_layout y_layout, float* y_out) {
  return run(conv, batch, height, width, x_layout, x, y_layout, y_out,
             [&](const qpack::ConvKernel& k, const qpack::ConvShape& s) { k.run_f32(s, x, y_out); });
}

qpack_status qpack_conv2d_run_u8(const qpack_conv2d* conv, int64_t batch, int64_t height,
                                 int64_t width, qpack_layout x_layout, const uint8_t* x,
                                 float input_scale, int32_t input_zero_point,
                                 qpack_layout y_layout, uint8_t* y_out) {
  return run(conv, batch, height, width, x_layout, x, y_layout, y_out,
             [&](const qpack::ConvKernel& k, const qpack::ConvShape& s) {
               k.run_u8(s, x, input_scale, input_zero_point, y_out);
             });
}

qpack_status qpack_conv2d_release_original(qpack_conv2d* conv) {
  return api::release_original(conv, kWhat);
}

qpack_status qpack_conv2d_unpack(const qpack_conv2d* conv, void* weight_out, float* bias_out) {
  return api::unpack(conv, kWhat, weight_out, bias_out);
}

qpack_status qpack_conv2d_get_info(const qpack_conv2d* conv, qpack_conv2d_info* info_out) {
  return api::info(conv, kWhat, info_out);
}

qpack_status qpack_conv2d_get_stats(const qpack_conv2d* conv, qpack_conv2d_stats* stats_out) {
  return api::stats(conv, kWhat, stats_out);
}

}  // extern "C"
