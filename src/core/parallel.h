// Splitting work over qpack's thread count: the one place the core names its
// thread runtime (OpenMP, the runtime oneDNN uses and QNNPACK's loops run on
// in qpack, see backends/qnnpack/threadpool_omp.cc). Built without OpenMP
// (QPACK_OPENMP=OFF) the core's loops run on the calling thread.
#pragma once

#include <cstdint>

#include "core/policy.h"

namespace qpack {

// Calls body(chunk, begin, end) over [0, n) in equal parts, one per thread
// of `threads` (pass num_threads(); one part, on the caller, below `grain`
// items or with one thread). Returns the number of parts.
template <typename Body>
int parallel_chunks(int64_t n, int64_t grain, int threads, const Body& body) {
#ifdef _OPENMP
  const int chunks = (threads <= 1 || n < grain) ? 1 : threads;
#else
  (void)grain;  // built without OpenMP (QPACK_OPENMP=OFF): one part, on the caller
  (void)threads;
  const int chunks = 1;
#endif
  if (chunks == 1) {
    body(0, int64_t(0), n);
    return 1;
  }
#pragma omp parallel for num_threads(chunks) schedule(static)
  for (int t = 0; t < chunks; ++t) body(t, n * t / chunks, n * (t + 1) / chunks);
  return chunks;
}

}  // namespace qpack
