// The list of backends: the one file that names every backend qpack knows
// (core/registry.h). Order is AUTO's preference: QNNPACK first for int8 (the
// kernels PyTorch uses on phones), oneDNN for what QNNPACK lacks. A backend
// left out of the build keeps its entry, with no ops.
#include "core/registry.h"

#if QPACK_WITH_ONEDNN
#include "backends/onednn/runtime.h"
#endif
#if QPACK_WITH_QNNPACK
#include "backends/qnnpack/runtime.h"
#endif

namespace qpack {

const std::vector<Backend>& backends() {
  static const std::vector<Backend> list = {
#if QPACK_WITH_QNNPACK
      {QPACK_BACKEND_QNNPACK, "qnnpack", "QNNPACK", qnnpack_rt::ops()},
#else
      {QPACK_BACKEND_QNNPACK, "qnnpack", "QNNPACK", {}},
#endif
#if QPACK_WITH_ONEDNN
      {QPACK_BACKEND_ONEDNN, "onednn", "oneDNN", onednn_rt::ops()},
#else
      {QPACK_BACKEND_ONEDNN, "onednn", "oneDNN", {}},
#endif
  };
  return list;
}

}  // namespace qpack
