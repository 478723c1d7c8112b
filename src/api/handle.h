// What every C handle of a packed op shares: the shared pointer that close()
// clears, and the lifetime functions (create, close, release, unpack, stats)
// written once for all ops. A run copies the pointer into a local first, so a
// concurrent close() cannot free the op mid-run.
#pragma once

#include <atomic>
#include <memory>
#include <utility>

#include "api/guard.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/packed_op.h"
#include "core/policy.h"
#include "qpack/qpack.h"

namespace qpack {
namespace api {

template <typename Op>
struct Handle {
  std::shared_ptr<Op> impl;  // atomic_load/atomic_store only
};

// The live op behind a handle, or CLOSED; `what` names the op in messages.
template <typename H>
auto live(const H* handle, const char* what) {
  check(handle != nullptr, QPACK_STATUS_INVALID_ARGUMENT, what, " handle is NULL");
  auto impl = std::atomic_load(&handle->impl);
  check(impl != nullptr, QPACK_STATUS_CLOSED, "this packed ", what, " was closed");
  return impl;
}

// A run's batch and data pointers (null is allowed for an empty batch).
inline void check_batch_io(int64_t batch, const void* x, const void* y) {
  check(batch >= 0, QPACK_STATUS_INVALID_ARGUMENT, "batch must be >= 0, got ", batch);
  check(batch == 0 || (x != nullptr && y != nullptr), QPACK_STATUS_INVALID_ARGUMENT,
        "input or output pointer is NULL");
}

template <typename H, typename Params, typename MakeSpec>
qpack_status create(const Params* params, H** out, MakeSpec make_spec) {
  return guarded([&] {
    check(params != nullptr && out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
          "params or the output handle pointer is NULL");
    *out = nullptr;
    auto spec = make_spec(*params);
    const bool retain = resolve_retain(params->retain);
    using Op = typename decltype(H::impl)::element_type;
    auto impl = std::make_shared<Op>(std::move(spec), params->weight, retain);
    auto* handle = new H;
    handle->impl = std::move(impl);
    *out = handle;
  });
}

template <typename H>
qpack_status close(H* handle, const char* what) {
  return guarded([&] {
    check(handle != nullptr, QPACK_STATUS_INVALID_ARGUMENT, what, " handle is NULL");
    using Ptr = decltype(H::impl);
    std::atomic_store(&handle->impl, Ptr());
  });
}

// Closed: 1 when close() was called (the handle stays valid until destroy).
template <typename H>
int is_closed(const H* handle) {
  return std::atomic_load(&handle->impl) == nullptr ? 1 : 0;
}

template <typename H>
qpack_status release_original(H* handle, const char* what) {
  return guarded([&] { live(handle, what)->release_original(); });
}

template <typename H>
qpack_status unpack(const H* handle, const char* what, void* weight_out, float* bias_out) {
  return guarded([&] { live(handle, what)->unpack(weight_out, bias_out); });
}

template <typename H>
qpack_status stats(const H* handle, const char* what, qpack_op_stats* out) {
  return guarded([&] {
    check(out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "stats_out is NULL");
    const auto& c = live(handle, what)->kernel().counters();
    out->states_built = c.states_built.load();
    out->cache_hits = c.cache_hits.load();
    out->evictions = c.evictions.load();
    out->runs = c.runs.load();
    out->split_runs = c.split_runs.load();
  });
}

// Fields every info struct has, filled from the op; zeros (and closed = 1)
// once the op was closed.
template <typename H, typename Info>
qpack_status info(const H* handle, const char* what, Info* out) {
  return guarded([&] {
    check(handle != nullptr && out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, what,
          " handle or info_out is NULL");
    *out = Info{};
    out->closed = 1;
    auto impl = std::atomic_load(&handle->impl);
    if (impl == nullptr) return;
    out->closed = 0;
    const auto& s = impl->spec();
    out->mode = s.mode;
    out->backend = s.backend;
    out->has_bias = s.bias.empty() ? 0 : 1;
    out->has_original = impl->has_original() ? 1 : 0;
    out->num_weight_scales = static_cast<int64_t>(s.weight_scales.size());
    out->nbytes_packed = impl->kernel().nbytes_packed();
    out->nbytes_original = impl->nbytes_original();
    fill_geometry(s, out);
  });
}

}  // namespace api
}  // namespace qpack

// The opaque handle types of qpack.h.
struct qpack_linear : qpack::api::Handle<qpack::Linear> {};
struct qpack_conv2d : qpack::api::Handle<qpack::Conv> {};
struct qpack_graph : qpack::api::Handle<qpack::Graph> {};

