// QNNPACK process state: one-time initialisation and per-thread thread pools.
#pragma once

#include <pthreadpool.h>

#include <string>

namespace qpack {
namespace qnnpack_rt {

// Initialises QNNPACK once; throws qpack::Error(UNSUPPORTED) if it cannot run here.
void ensure_initialized();
bool available();
std::string describe();
// Thread pool for the calling thread sized to qpack's thread count; nullptr
// (run on the caller) when that count is 1. One pool per calling thread, so
// that concurrent runs never queue behind one another.
pthreadpool_t thread_pool();
uint32_t gemm_nr();
uint32_t gemm_kr();
uint32_t gemm_mr();

}  // namespace qnnpack_rt
}  // namespace qpack
