// pthreadpool's legacy compute API (the part QNNPACK calls) on OpenMP.
//
// QNNPACK is built with PYTORCH_QNNPACK_CUSTOM_THREADPOOL: it calls the
// pthreadpool_compute_* functions, and qpack provides them here. Running
// QNNPACK's tiles in OpenMP parallel regions puts them on the same OpenMP
// runtime as oneDNN (and as PyTorch, which loads the same libgomp), instead of
// a second pool of threads that competes with OpenMP's spinning workers: with
// Debian's pthreadpool, a 2-thread QNNPACK model between PyTorch ops ran 5x
// slower than with 1 thread on a 2-core machine.
#include <omp.h>
#include <pthreadpool.h>

#include <algorithm>
#include <cstddef>
#include <new>

struct pthreadpool {
  size_t threads;
};

namespace {
inline bool serial(pthreadpool_t pool, size_t work) {
  return pool == nullptr || pool->threads <= 1 || work <= 1;
}
inline size_t tiles(size_t range, size_t tile) { return (range + tile - 1) / tile; }

// Runs body(t) for t in [0, n): on the caller, or in an OpenMP team. Static
// scheduling: QNNPACK tiles are uniform, and dynamic chunking cost 2x scaling.
template <typename Body>
void run_tiles(pthreadpool_t pool, size_t n, const Body& body) {
  if (serial(pool, n)) {
    for (size_t t = 0; t < n; ++t) body(t);
    return;
  }
#pragma omp parallel for num_threads(pool->threads) schedule(static)
  for (size_t t = 0; t < n; ++t) body(t);
}
}  // namespace

extern "C" {

pthreadpool_t pthreadpool_create(size_t threads_count) {
  if (threads_count == 0) threads_count = static_cast<size_t>(omp_get_num_procs());
  return new (std::nothrow) pthreadpool{threads_count};
}

void pthreadpool_destroy(pthreadpool_t threadpool) { delete threadpool; }

size_t pthreadpool_get_threads_count(pthreadpool_t threadpool) {
  return threadpool == nullptr ? 1 : threadpool->threads;
}

void pthreadpool_compute_1d(pthreadpool_t pool, pthreadpool_function_1d_t function,
                            void* argument, size_t range) {
  if (serial(pool, range)) {
    for (size_t i = 0; i < range; ++i) function(argument, i);
    return;
  }
#pragma omp parallel for num_threads(pool->threads) schedule(static)
  for (size_t i = 0; i < range; ++i) function(argument, i);
}

void pthreadpool_compute_1d_tiled(pthreadpool_t pool, pthreadpool_function_1d_tiled_t function,
                                  void* argument, size_t range, size_t tile) {
  const size_t n = tiles(range, tile);
  auto body = [&](size_t t) {
    const size_t i = t * tile;
    function(argument, i, std::min(tile, range - i));
  };
  run_tiles(pool, n, body);
}

void pthreadpool_compute_2d(pthreadpool_t pool, pthreadpool_function_2d_t function,
                            void* argument, size_t range_i, size_t range_j) {
  const size_t n = range_i * range_j;
  if (serial(pool, n)) {
    for (size_t i = 0; i < range_i; ++i)
      for (size_t j = 0; j < range_j; ++j) function(argument, i, j);
    return;
  }
#pragma omp parallel for num_threads(pool->threads) schedule(static)
  for (size_t t = 0; t < n; ++t) function(argument, t / range_j, t % range_j);
}

void pthreadpool_compute_2d_tiled(pthreadpool_t pool, pthreadpool_function_2d_tiled_t function,
                                  void* argument, size_t range_i, size_t range_j, size_t tile_i,
                                  size_t tile_j) {
  const size_t ni = tiles(range_i, tile_i), nj = tiles(range_j, tile_j), n = ni * nj;
  auto body = [&](size_t t) {
    const size_t i = (t / nj) * tile_i, j = (t % nj) * tile_j;
    function(argument, i, j, std::min(tile_i, range_i - i), std::min(tile_j, range_j - j));
  };
  run_tiles(pool, n, body);
}

void pthreadpool_compute_3d_tiled(pthreadpool_t pool, pthreadpool_function_3d_tiled_t function,
                                  void* argument, size_t range_i, size_t range_j, size_t range_k,
                                  size_t tile_i, size_t tile_j, size_t tile_k) {
  const size_t ni = tiles(range_i, tile_i), nj = tiles(range_j, tile_j),
               nk = tiles(range_k, tile_k), n = ni * nj * nk;
  auto body = [&](size_t t) {
    const size_t i = (t / (nj * nk)) * tile_i, j = ((t / nk) % nj) * tile_j,
                 k = (t % nk) * tile_k;
    function(argument, i, j, k, std::min(tile_i, range_i - i), std::min(tile_j, range_j - j),
             std::min(tile_k, range_k - k));
  };
  run_tiles(pool, n, body);
}

void pthreadpool_compute_4d_tiled(pthreadpool_t pool, pthreadpool_function_4d_tiled_t function,
                                  void* argument, size_t range_i, size_t range_j, size_t range_k,
                                  size_t range_l, size_t tile_i, size_t tile_j, size_t tile_k,
                                  size_t tile_l) {
  const size_t ni = tiles(range_i, tile_i), nj = tiles(range_j, tile_j),
               nk = tiles(range_k, tile_k), nl = tiles(range_l, tile_l), n = ni * nj * nk * nl;
  auto body = [&](size_t t) {
    const size_t i = (t / (nj * nk * nl)) * tile_i, j = ((t / (nk * nl)) % nj) * tile_j,
                 k = ((t / nl) % nk) * tile_k, l = (t % nl) * tile_l;
    function(argument, i, j, k, l, std::min(tile_i, range_i - i), std::min(tile_j, range_j - j),
             std::min(tile_k, range_k - k), std::min(tile_l, range_l - l));
  };
  run_tiles(pool, n, body);
}

}  // extern "C"
