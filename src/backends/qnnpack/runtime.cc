#include "backends/qnnpack/runtime.h"

#include <pthread.h>
#include <pytorch_qnnpack.h>
#include <qnnpack/params.h>

#include <memory>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "core/policy.h"

namespace qpack {
namespace qnnpack_rt {
namespace {
std::once_flag g_once;
pytorch_qnnp_status g_status = pytorch_qnnp_status_uninitialized;

struct PoolDeleter {
  void operator()(pthreadpool* p) const {
    if (p != nullptr) pthreadpool_destroy(p);
  }
};
struct ThreadPool {
  std::unique_ptr<pthreadpool, PoolDeleter> pool;
  int threads = 0;
};
thread_local ThreadPool t_pool;

// In a forked child the pool's worker threads are gone: destroying it would
// wait for them forever, so the forking thread's pool is abandoned instead.
void abandon_pool_in_child() {
  (void)t_pool.pool.release();
  t_pool.threads = 0;
}
struct AtForkRegistration {
  AtForkRegistration() { pthread_atfork(nullptr, nullptr, abandon_pool_in_child); }
} g_at_fork;
}  // namespace

void ensure_initialized() {
  std::call_once(g_once, [] { g_status = pytorch_qnnp_initialize(); });
  check(g_status == pytorch_qnnp_status_success, QPACK_STATUS_UNSUPPORTED,
        "QNNPACK could not initialise on this CPU (status ", static_cast<int>(g_status),
        "); use backend='onednn'");
}

bool available() {
  try {
    ensure_initialized();
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string describe() {
  std::ostringstream os;
  os << "pytorch_qnnpack (PyTorch 1.13.1 source)";
  if (available()) {
    os << "; gemm mr=" << gemm_mr() << " nr=" << gemm_nr() << " kr=" << gemm_kr();
#if defined(__x86_64__) || defined(__i386__)
    os << "; isa=sse2";
#elif defined(__aarch64__)
    os << "; isa=neon64";
#elif defined(__arm__)
    os << "; isa=neon";
#endif
  }
  return os.str();
}

pthreadpool_t thread_pool() {
  int n = num_threads();
  if (n <= 1) return nullptr;
  if (t_pool.threads != n) {
    t_pool.pool.reset(pthreadpool_create(static_cast<size_t>(n)));
    t_pool.threads = t_pool.pool ? n : 0;
  }
  return t_pool.pool.get();
}

WeightQuant::WeightQuant(const OpSpec& spec, int64_t channels, int64_t padded)
    : zero_points(static_cast<size_t>(padded), 128), scales(static_cast<size_t>(padded), 1.0f) {
  for (int64_t n = 0; n < channels; ++n) {
    zero_points[n] = static_cast<uint8_t>(spec.weight_zero_point(n) + 128);
    scales[n] = spec.weight_scale(n);
  }
}

BackendOps ops() {
  constexpr unsigned stat = 1u << QPACK_MODE_INT8_STATIC, dyn = 1u << QPACK_MODE_INT8_DYNAMIC;
  BackendOps o;
  o.available = available;
  o.describe = describe;
  o.asymmetric_weights = true;  // per-channel uint8 kernel zero points
  o.linear = {stat | dyn, make_linear};
  o.conv2d = {stat, make_conv};
  return o;
}

uint32_t gemm_nr() { return pytorch_qnnp_params.q8conv.nr; }
uint32_t gemm_kr() { return pytorch_qnnp_params.q8conv.kr; }
uint32_t gemm_mr() { return pytorch_qnnp_params.q8conv.mr; }

}  // namespace qnnpack_rt
}  // namespace qpack
