// The list of backends: the one file that names every backend qpack knows
// (core/registry.h). Order is AUTO's preference, by architecture: on x86-64
// oneDNN first (its AVX-512 VNNI / AVX2 int8 kernels; QNNPACK's x86 kernels
// are SSE2 builds of phone code: ResNet-18 int8 10.7 ms on oneDNN against
// 86.6 on QNNPACK, bench/bench_models.py), elsewhere QNNPACK first (the
// kernels PyTorch uses on phones). AUTO skips a backend without the op and
// mode, and, for int8 weights with zero points, one that takes symmetric
// weights only. A backend left out of the build keeps its entry, with no ops.
#include "core/registry.h"

#if QPACK_WITH_ONEDNN
#include "backends/onednn/runtime.h"
#endif
#if QPACK_WITH_QNNPACK
#include "backends/qnnpack/runtime.h"
#endif

namespace qpack {

const std::vector<Backend>& backends() {
  static const std::vector<Backend> list = [] {
#if QPACK_WITH_QNNPACK
    Backend qnnpack{QPACK_BACKEND_QNNPACK, "qnnpack", "QNNPACK", qnnpack_rt::ops()};
#else
    Backend qnnpack{QPACK_BACKEND_QNNPACK, "qnnpack", "QNNPACK", {}};
#endif
#if QPACK_WITH_ONEDNN
    Backend onednn{QPACK_BACKEND_ONEDNN, "onednn", "oneDNN", onednn_rt::ops()};
#else
    Backend onednn{QPACK_BACKEND_ONEDNN, "onednn", "oneDNN", {}};
#endif
#if defined(__x86_64__) || defined(_M_X64)
    return std::vector<Backend>{onednn, qnnpack};
#else
    return std::vector<Backend>{qnnpack, onednn};
#endif
  }();
  return list;
}

}  // namespace qpack
