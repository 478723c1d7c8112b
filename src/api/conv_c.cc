// extern "C" surface of the packed conv2d (qpack_conv2d_*). Same conventions
// as the linear layer: status return, thread-local message, handles that a
// concurrent close() cannot free mid-run.
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>

#include "api/guard.h"
#include "core/conv.h"
#include "core/error.h"
#include "core/policy.h"
#include "qpack/qpack.h"

struct qpack_conv2d {
  std::shared_ptr<qpack::Conv> impl;  // atomic_load/atomic_store only
};

namespace {
using qpack::api::guarded;

std::shared_ptr<qpack::Conv> live(const qpack_conv2d* conv) {
  qpack::check(conv != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "conv2d handle is NULL");
  auto impl = std::atomic_load(&conv->impl);
  qpack::check(impl != nullptr, QPACK_STATUS_CLOSED, "this packed convolution was closed");
  return impl;
}

qpack::ConvShape run_shape(const qpack::Conv& c, int64_t batch, int64_t height, int64_t width,
                           qpack_layout x_layout, const void* x, qpack_layout y_layout,
                           const void* y) {
  qpack::check(batch >= 0, QPACK_STATUS_INVALID_ARGUMENT, "batch must be >= 0, got ", batch);
  qpack::check(batch == 0 || (x != nullptr && y != nullptr), QPACK_STATUS_INVALID_ARGUMENT,
               "input or output pointer is NULL");
  auto valid = [](qpack_layout l) { return l == QPACK_LAYOUT_NCHW || l == QPACK_LAYOUT_NHWC; };
  qpack::check(valid(x_layout) && valid(y_layout), QPACK_STATUS_INVALID_ARGUMENT,
               "layout must be QPACK_LAYOUT_NCHW or QPACK_LAYOUT_NHWC");
  qpack::ConvShape s{batch, height, width, 0, 0, x_layout, y_layout};
  c.spec().output_size(height, width, &s.OH, &s.OW);
  const int64_t limit = int64_t(1) << 40;
  qpack::check(height < limit / width && batch < limit / (height * width * c.spec().IC + 1) &&
                   batch < limit / (s.OH * s.OW * c.spec().OC + 1),
               QPACK_STATUS_INVALID_ARGUMENT, "input or output is too large");
  return s;
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
  return guarded([&] {
    qpack::check(params != nullptr && conv_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "params or conv_out is NULL");
    *conv_out = nullptr;
    qpack::ConvSpec spec = qpack::make_conv_spec(*params);
    bool retain = qpack::resolve_retain(params->retain);
    auto impl = std::make_shared<qpack::Conv>(std::move(spec), params->weight, retain);
    auto* handle = new qpack_conv2d;
    handle->impl = std::move(impl);
    *conv_out = handle;
  });
}

void qpack_conv2d_destroy(qpack_conv2d* conv) { delete conv; }

qpack_status qpack_conv2d_close(qpack_conv2d* conv) {
  return guarded([&] {
    qpack::check(conv != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "conv2d handle is NULL");
    std::atomic_store(&conv->impl, std::shared_ptr<qpack::Conv>());
  });
}

qpack_status qpack_conv2d_output_size(const qpack_conv2d* conv, int64_t height, int64_t width,
                                      int64_t* out_h_out, int64_t* out_w_out) {
  return guarded([&] {
    qpack::check(out_h_out != nullptr && out_w_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "out_h_out or out_w_out is NULL");
    live(conv)->spec().output_size(height, width, out_h_out, out_w_out);
  });
}

qpack_status qpack_conv2d_run_f32(const qpack_conv2d* conv, int64_t batch, int64_t height,
                                  int64_t width, qpack_layout x_layout, const float* x,
                                  qpack_layout y_layout, float* y_out) {
  return guarded([&] {
    auto impl = live(conv);
    auto s = run_shape(*impl, batch, height, width, x_layout, x, y_layout, y_out);
    impl->kernel().run_f32(s, x, y_out);
  });
}

qpack_status qpack_conv2d_run_u8(const qpack_conv2d* conv, int64_t batch, int64_t height,
                                 int64_t width, qpack_layout x_layout, const uint8_t* x,
                                 float input_scale, int32_t input_zero_point,
                                 qpack_layout y_layout, uint8_t* y_out) {
  return guarded([&] {
    auto impl = live(conv);
    auto s = run_shape(*impl, batch, height, width, x_layout, x, y_layout, y_out);
    impl->kernel().run_u8(s, x, input_scale, input_zero_point, y_out);
  });
}

qpack_status qpack_conv2d_release_original(qpack_conv2d* conv) {
  return guarded([&] { live(conv)->release_original(); });
}

qpack_status qpack_conv2d_unpack(const qpack_conv2d* conv, void* weight_out, float* bias_out) {
  return guarded([&] { live(conv)->unpack(weight_out, bias_out); });
}

qpack_status qpack_conv2d_get_info(const qpack_conv2d* conv, qpack_conv2d_info* info_out) {
  return guarded([&] {
    qpack::check(info_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "info_out is NULL");
    auto impl = live(conv);
    const auto& s = impl->spec();
    info_out->in_channels = s.IC;
    info_out->out_channels = s.OC;
    info_out->groups = s.groups;
    info_out->kernel_h = s.KH;
    info_out->kernel_w = s.KW;
    info_out->mode = s.mode;
    info_out->backend = s.backend;
    info_out->has_bias = s.bias.empty() ? 0 : 1;
    info_out->has_original = impl->has_original() ? 1 : 0;
    info_out->num_weight_scales = static_cast<int64_t>(s.weight_scales.size());
    info_out->nbytes_packed = impl->kernel().nbytes_packed();
    info_out->nbytes_original = impl->nbytes_original();
  });
}

qpack_status qpack_conv2d_get_stats(const qpack_conv2d* conv, qpack_conv2d_stats* stats_out) {
  return guarded([&] {
    qpack::check(stats_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "stats_out is NULL");
    auto& c = live(conv)->kernel().counters();
    stats_out->states_built = c.states_built.load();
    stats_out->cache_hits = c.cache_hits.load();
    stats_out->evictions = c.evictions.load();
    stats_out->runs = c.runs.load();
  });
}

}  // extern "C"
