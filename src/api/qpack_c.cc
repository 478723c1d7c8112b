// extern "C" surface of libqpack. Catches every C++ exception at the
// boundary and turns it into a status plus a thread-local message.
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "api/guard.h"
#include "backends/onednn/runtime.h"
#include "backends/qnnpack/runtime.h"
#include "core/error.h"
#include "core/linear.h"
#include "core/policy.h"
#include "qpack/qpack.h"

#ifndef QPACK_MOBILE
#define QPACK_MOBILE 0
#endif

// The handle: a shared pointer that close() clears. A run copies it into a
// local first, so a concurrent close() cannot free the layer mid-run.
struct qpack_linear {
  std::shared_ptr<qpack::Linear> impl;  // atomic_load/atomic_store only
};

namespace {
using qpack::api::guarded;

std::shared_ptr<qpack::Linear> live(const qpack_linear* linear) {
  qpack::check(linear != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "linear handle is NULL");
  auto impl = std::atomic_load(&linear->impl);
  qpack::check(impl != nullptr, QPACK_STATUS_CLOSED, "this packed linear was closed");
  return impl;
}

void check_run_args(const qpack::Linear& l, int64_t batch, const void* x, const void* y) {
  qpack::check(batch >= 0, QPACK_STATUS_INVALID_ARGUMENT, "batch must be >= 0, got ", batch);
  qpack::check(batch == 0 || (x != nullptr && y != nullptr), QPACK_STATUS_INVALID_ARGUMENT,
               "input or output pointer is NULL");
  (void)l;
}
}  // namespace

extern "C" {

const char* qpack_last_error(void) { return qpack::api::last_error().c_str(); }

int qpack_get_default_retain(void) { return qpack::default_retain() ? 1 : 0; }
void qpack_set_default_retain(int keep) { qpack::set_default_retain(keep != 0); }
int qpack_set_thread_retain(int retain) {
  if (retain != QPACK_RETAIN_KEEP && retain != QPACK_RETAIN_RELEASE) retain = QPACK_RETAIN_DEFAULT;
  return qpack::set_thread_retain(retain);
}
int qpack_get_thread_retain(void) { return qpack::thread_retain(); }
int qpack_resolve_retain(int retain) { return qpack::resolve_retain(retain) ? 1 : 0; }

qpack_status qpack_set_num_threads(int num_threads) {
  return guarded([&] {
    qpack::check(num_threads >= 1 && num_threads <= 4096, QPACK_STATUS_INVALID_ARGUMENT,
                 "num_threads must be in [1, 4096], got ", num_threads);
    qpack::set_num_threads(num_threads);
  });
}
int qpack_get_num_threads(void) { return qpack::num_threads(); }

int qpack_in_forked_child(void) { return qpack::in_forked_child() ? 1 : 0; }

int qpack_build_mobile(void) { return QPACK_MOBILE ? 1 : 0; }

int qpack_backend_available(qpack_backend backend) {
  if (backend == QPACK_BACKEND_ONEDNN) return 1;
  if (backend == QPACK_BACKEND_QNNPACK) return qpack::qnnpack_rt::available() ? 1 : 0;
  return 0;
}

qpack_status qpack_backend_describe(qpack_backend backend, char* buf, size_t size) {
  return guarded([&] {
    qpack::check(buf != nullptr && size > 0, QPACK_STATUS_INVALID_ARGUMENT, "buffer is NULL");
    std::string text;
    if (backend == QPACK_BACKEND_ONEDNN) {
      text = qpack::onednn_rt::describe();
    } else if (backend == QPACK_BACKEND_QNNPACK) {
      text = qpack::qnnpack_rt::describe();
    } else {
      qpack::fail(QPACK_STATUS_INVALID_ARGUMENT, "unknown backend ", static_cast<int>(backend));
    }
    std::strncpy(buf, text.c_str(), size - 1);
    buf[size - 1] = '\0';
  });
}

void qpack_linear_params_init(qpack_linear_params* params) {
  if (params == nullptr) return;
  std::memset(params, 0, sizeof(*params));
  params->mode = QPACK_MODE_F32;
  params->backend = QPACK_BACKEND_AUTO;
  params->retain = QPACK_RETAIN_DEFAULT;
  params->clamp_min = -INFINITY;
  params->clamp_max = INFINITY;
}

qpack_status qpack_linear_create(const qpack_linear_params* params, qpack_linear** linear_out) {
  return guarded([&] {
    qpack::check(params != nullptr && linear_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "params or linear_out is NULL");
    *linear_out = nullptr;
    qpack::LinearSpec spec = qpack::make_linear_spec(*params);
    bool retain = qpack::resolve_retain(params->retain);
    auto impl = std::make_shared<qpack::Linear>(std::move(spec), params->weight, retain);
    auto* handle = new qpack_linear;
    handle->impl = std::move(impl);
    *linear_out = handle;
  });
}

void qpack_linear_destroy(qpack_linear* linear) { delete linear; }

qpack_status qpack_linear_close(qpack_linear* linear) {
  return guarded([&] {
    qpack::check(linear != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "linear handle is NULL");
    std::atomic_store(&linear->impl, std::shared_ptr<qpack::Linear>());
  });
}

qpack_status qpack_linear_run_f32(const qpack_linear* linear, int64_t batch, const float* x,
                                  float* y_out) {
  return guarded([&] {
    auto impl = live(linear);
    check_run_args(*impl, batch, x, y_out);
    impl->kernel().run_f32(batch, x, y_out);
  });
}

qpack_status qpack_linear_run_u8(const qpack_linear* linear, int64_t batch, const uint8_t* x,
                                 float input_scale, int32_t input_zero_point, uint8_t* y_out) {
  return guarded([&] {
    auto impl = live(linear);
    check_run_args(*impl, batch, x, y_out);
    impl->kernel().run_u8(batch, x, input_scale, input_zero_point, y_out);
  });
}

qpack_status qpack_linear_release_original(qpack_linear* linear) {
  return guarded([&] { live(linear)->release_original(); });
}

qpack_status qpack_linear_unpack(const qpack_linear* linear, void* weight_out, float* bias_out) {
  return guarded([&] { live(linear)->unpack(weight_out, bias_out); });
}

qpack_status qpack_linear_get_info(const qpack_linear* linear, qpack_linear_info* info_out) {
  return guarded([&] {
    qpack::check(info_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "info_out is NULL");
    auto impl = live(linear);
    const auto& s = impl->spec();
    info_out->in_features = s.K;
    info_out->out_features = s.N;
    info_out->mode = s.mode;
    info_out->backend = s.backend;
    info_out->has_bias = s.bias.empty() ? 0 : 1;
    info_out->has_original = impl->has_original() ? 1 : 0;
    info_out->closed = 0;
    info_out->num_weight_scales = static_cast<int64_t>(s.weight_scales.size());
    info_out->nbytes_packed = impl->kernel().nbytes_packed();
    info_out->nbytes_original = impl->nbytes_original();
  });
}

qpack_status qpack_linear_get_stats(const qpack_linear* linear, qpack_linear_stats* stats_out) {
  return guarded([&] {
    qpack::check(stats_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "stats_out is NULL");
    auto impl = live(linear);
    auto& c = impl->kernel().counters();
    stats_out->states_built = c.states_built.load();
    stats_out->cache_hits = c.cache_hits.load();
    stats_out->evictions = c.evictions.load();
    stats_out->runs = c.runs.load();
  });
}

}  // extern "C"
