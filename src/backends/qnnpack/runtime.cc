#include "backends/qnnpack/runtime.h"

#include <cmath>
#include <sstream>

#include "core/bytes.h"

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

namespace {
constexpr uint32_t kLayoutTag = 0x504E4E51;  // "QNNP"
constexpr uint32_t kLayoutVersion = 1;
}  // namespace

std::vector<uint8_t> QLayout::bytes() const {
  ByteWriter w;
  w.put(kLayoutTag);
  w.put(kLayoutVersion);
  w.put(kind);
  w.put(nr);
  w.put(kr);
  w.put(cr);
  w.put(packed_size);
  w.put(bias_input_scale);
  return w.take();
}

QLayout QLayout::parse(const std::vector<uint8_t>& bytes, const std::string& what) {
  ByteReader r(bytes.data(), bytes.size(), what + "'s QNNPACK layout");
  r.expect(r.get<uint32_t>() == kLayoutTag, "tag");
  r.expect(r.get<uint32_t>() == kLayoutVersion, "version (written by a newer qpack?)");
  QLayout l;
  l.kind = r.get<uint32_t>();
  r.expect(l.kind <= conv, "kind");
  l.nr = r.get<uint32_t>();
  l.kr = r.get<uint32_t>();
  l.cr = r.get<uint32_t>();
  r.expect(l.nr <= 64 && l.kr <= 64 && l.cr <= 64, "micro-kernel blocking");
  r.expect(l.kind == dwconv ? l.cr >= 1 : (l.nr >= 1 && l.kr >= 1), "micro-kernel blocking");
  l.packed_size = r.get<uint64_t>();
  l.bias_input_scale = r.get<float>();
  r.expect(std::isfinite(l.bias_input_scale) && l.bias_input_scale >= 0.0f, "bias input scale");
  r.expect(r.remaining() == 0, "length");
  return l;
}

bool QLayout::same_blocking(const QLayout& o) const {
  return kind == o.kind && nr == o.nr && kr == o.kr && cr == o.cr && packed_size == o.packed_size;
}

std::string QLayout::str() const {
  static const char* names[] = {"linear", "dwconv", "gemm", "conv"};
  std::ostringstream os;
  os << names[kind] << " nr=" << nr << " kr=" << kr << " cr=" << cr << " " << packed_size << " B";
  return os.str();
}

std::string build_id() { return "qnnpack pytorch-1.13.1 pack 1"; }

std::string isa_name() {
#if defined(__aarch64__)
  return "aarch64-neon";
#elif defined(__arm__)
  return "arm-neon";
#else
  return "x86_64-sse2";
#endif
}

BackendOps ops() {
  constexpr unsigned stat = 1u << QPACK_MODE_INT8_STATIC, dyn = 1u << QPACK_MODE_INT8_DYNAMIC;
  BackendOps o;
  o.available = available;
  o.describe = describe;
  o.asymmetric_weights = true;  // per-channel uint8 kernel zero points
  o.build_id = build_id;
  o.isa = isa_name;
  o.linear = {stat | dyn, make_linear, load_linear};
  o.conv2d = {stat, make_conv, load_conv};
  o.graph = graph_ops();
  return o;
}

uint32_t gemm_nr() { return pytorch_qnnp_params.q8conv.nr; }
uint32_t gemm_kr() { return pytorch_qnnp_params.q8conv.kr; }
uint32_t gemm_mr() { return pytorch_qnnp_params.q8conv.mr; }

}  // namespace qnnpack_rt
}  // namespace qpack
