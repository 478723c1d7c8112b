#include "core/policy.h"

#include <pthread.h>

#include <atomic>
#include <thread>

#include "qpack/qpack.h"

#ifndef QPACK_MOBILE
#define QPACK_MOBILE 0
#endif

namespace qpack {
namespace {
// Mobile builds release originals by default (PyTorch's
// releaseWeightsWhenPrepacking); server builds keep them.
std::atomic<bool> g_default_retain{!QPACK_MOBILE};
thread_local int t_retain = QPACK_RETAIN_DEFAULT;

int initial_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}
std::atomic<int> g_num_threads{initial_threads()};

// After fork() the child has one thread; thread pools inherited from the
// parent (OpenMP's team, QNNPACK's pthreadpool) refer to threads that do not
// exist there and would hang. A forked child therefore runs every op on the
// calling thread.
std::atomic<bool> g_forked_child{false};
void on_fork_child() { g_forked_child.store(true); }
struct AtForkRegistration {
  AtForkRegistration() { pthread_atfork(nullptr, nullptr, on_fork_child); }
} g_at_fork;
}  // namespace

bool in_forked_child() { return g_forked_child.load(std::memory_order_relaxed); }

bool default_retain() { return g_default_retain.load(std::memory_order_relaxed); }
void set_default_retain(bool keep) { g_default_retain.store(keep, std::memory_order_relaxed); }
int thread_retain() { return t_retain; }
int set_thread_retain(int r) {
  int previous = t_retain;
  t_retain = r;
  return previous;
}
bool resolve_retain(int request) {
  if (request == QPACK_RETAIN_KEEP) return true;
  if (request == QPACK_RETAIN_RELEASE) return false;
  if (t_retain != QPACK_RETAIN_DEFAULT) return t_retain == QPACK_RETAIN_KEEP;
  return default_retain();
}

int num_threads() {
  return in_forked_child() ? 1 : g_num_threads.load(std::memory_order_relaxed);
}
void set_num_threads(int n) { g_num_threads.store(n, std::memory_order_relaxed); }

}  // namespace qpack
