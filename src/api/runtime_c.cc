// extern "C": errors, retain policy, threads, build and backend queries.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "api/guard.h"
#include "core/attention.h"
#include "core/error.h"
#include "core/policy.h"
#include "core/quant.h"
#include "core/registry.h"
#include "qpack/qpack.h"

#ifndef QPACK_MOBILE
#define QPACK_MOBILE 0
#endif
#ifndef QPACK_VERSION_STRING
#define QPACK_VERSION_STRING "unknown"
#endif

using qpack::api::guarded;

extern "C" {

const char* qpack_last_error(void) { return qpack::api::last_error().c_str(); }

const char* qpack_version(void) { return QPACK_VERSION_STRING; }

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

qpack_status qpack_attention_f32(const float* q, const int64_t q_strides[3], const float* k,
                                 const int64_t k_strides[3], const float* v, const int64_t v_strides[3],
                                 float* out, const int64_t out_strides[3], int64_t batch, int64_t heads,
                                 int64_t L, int64_t S, int64_t D, float scale, int causal) {
  return qpack_attention_f32_mask(q, q_strides, k, k_strides, v, v_strides, nullptr, nullptr, out, out_strides,
                                  batch, heads, L, S, D, D, scale, causal);
}

qpack_status qpack_attention_f32_mask(const float* q, const int64_t q_strides[3], const float* k,
                                      const int64_t k_strides[3], const float* v, const int64_t v_strides[3],
                                      const float* mask, const int64_t mask_strides[3], float* out,
                                      const int64_t out_strides[3], int64_t batch, int64_t heads, int64_t L,
                                      int64_t S, int64_t D, int64_t Dv, float scale, int causal) {
  return guarded([&] {
    qpack::check(q_strides != nullptr && k_strides != nullptr && v_strides != nullptr && out_strides != nullptr,
                 QPACK_STATUS_INVALID_ARGUMENT, "attention: the stride arrays must not be NULL");
    qpack::check(mask == nullptr || mask_strides != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "attention: a mask needs its stride array");
    qpack::AttentionF32 a{q, k, v, out, {}, {}, {}, {}, batch, heads, L, S, D, Dv, scale, causal != 0, mask, {}};
    for (int i = 0; i < 3; ++i) {
      a.q_stride[i] = q_strides[i];
      a.k_stride[i] = k_strides[i];
      a.v_stride[i] = v_strides[i];
      a.out_stride[i] = out_strides[i];
      a.mask_stride[i] = mask != nullptr ? mask_strides[i] : 0;
    }
    qpack::attention_f32(a);
  });
}

qpack_status qpack_choose_qparams_u8(float min, float max, float* scale_out,
                                     int32_t* zero_point_out) {
  return qpack_choose_qparams_u8_max(min, max, 255, scale_out, zero_point_out);
}

qpack_status qpack_choose_qparams_u8_max(float min, float max, int32_t qmax, float* scale_out,
                                         int32_t* zero_point_out) {
  return guarded([&] {
    qpack::check(qmax >= 1 && qmax <= 255, QPACK_STATUS_INVALID_ARGUMENT, "qmax = ", qmax,
                 " is outside [1, 255]");
    qpack::check(scale_out != nullptr && zero_point_out != nullptr,
                 QPACK_STATUS_INVALID_ARGUMENT, "scale_out or zero_point_out is NULL");
    qpack::check(std::isfinite(min) && std::isfinite(max) && min <= max,
                 QPACK_STATUS_INVALID_ARGUMENT, "the range [", min, ", ", max,
                 "] must be finite with min <= max");
    const qpack::QParams q = qpack::choose_qparams_u8(min, max, qmax);
    *scale_out = q.scale;
    *zero_point_out = q.zero_point;
  });
}

int qpack_backend_count(void) { return static_cast<int>(qpack::backends().size()); }

qpack_status qpack_backend_get_info(int index, qpack_backend_info* info_out) {
  return guarded([&] {
    const auto& list = qpack::backends();
    qpack::check(index >= 0 && index < static_cast<int>(list.size()),
                 QPACK_STATUS_INVALID_ARGUMENT, "backend index ", index, " is outside [0, ",
                 list.size(), ")");
    qpack::check(info_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "info_out is NULL");
    const auto& b = list[static_cast<size_t>(index)];
    *info_out = qpack_backend_info{};
    info_out->backend = b.id;
    info_out->name = b.name;
    info_out->compiled = b.compiled() ? 1 : 0;
    info_out->available = b.available() ? 1 : 0;
    info_out->asymmetric_weights = b.ops.asymmetric_weights ? 1 : 0;
    info_out->linear_modes = qpack::op_modes(b, qpack::OpKind::linear);
    info_out->conv2d_modes = qpack::op_modes(b, qpack::OpKind::conv2d);
    const qpack::GraphOps& g = b.ops.graph;
    const std::pair<qpack::GraphOps::Make, qpack_node_kind> nodes[] = {
        {g.add, QPACK_NODE_ADD}, {g.max_pool, QPACK_NODE_MAXPOOL2D}, {g.avg_pool, QPACK_NODE_AVGPOOL2D},
        {g.global_avg_pool, QPACK_NODE_GLOBAL_AVGPOOL}};
    const std::pair<qpack::GraphOps::Make, qpack_activation> acts[] = {
        {g.clamp, QPACK_ACT_RELU}, {g.clamp, QPACK_ACT_CLAMP}, {g.sigmoid, QPACK_ACT_SIGMOID},
        {g.hardswish, QPACK_ACT_HARDSWISH}};
    for (const auto& e : nodes) info_out->graph_nodes |= e.first ? 1u << e.second : 0u;
    for (const auto& e : acts) info_out->graph_activations |= e.first ? 1u << e.second : 0u;
    if (info_out->graph_activations != 0) info_out->graph_nodes |= 1u << QPACK_NODE_ACTIVATION;
  });
}

int qpack_backend_available(qpack_backend backend) {
  for (const auto& b : qpack::backends()) {
    if (b.id == backend) return b.available() ? 1 : 0;
  }
  return 0;
}

int qpack_backend_int8_input_max(qpack_backend backend) {
  for (const auto& b : qpack::backends()) {
    if (b.id != backend || !b.available()) continue;
    return b.ops.int8_input_max != nullptr ? b.ops.int8_input_max() : 255;
  }
  return 0;
}

qpack_status qpack_backend_describe(qpack_backend backend, char* buf, size_t size) {
  return guarded([&] {
    qpack::check(buf != nullptr && size > 0, QPACK_STATUS_INVALID_ARGUMENT, "buffer is NULL");
    const auto& b = qpack::backend(backend);
    const std::string text =
        b.compiled() ? b.ops.describe() : std::string(b.display) + " (not in this build)";
    std::strncpy(buf, text.c_str(), size - 1);
    buf[size - 1] = '\0';
  });
}

}  // extern "C"
