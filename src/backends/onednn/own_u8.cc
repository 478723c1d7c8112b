#include "backends/onednn/own_u8.h"

#include <cstdlib>
#include <new>
#include <string>

#include "core/quant.h"

namespace qpack {
namespace onednn_rt {

void RequantU8::bounds(uint8_t* qmin, uint8_t* qmax) const {
  output_bounds_u8(clamp_min, clamp_max, dst_scale, dst_zero_point, qmin, qmax);
}

bool own_u8_available() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
#else
  return false;
#endif
}

bool own_avx2_available() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

bool own_enabled(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v) != "0";
}

void* own_u8_scratch(int slot, size_t size) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffers[2];
  Buffer& b = buffers[slot];
  if (b.size < size) {
    std::free(b.data);
    b.size = 0;
    b.data = std::aligned_alloc(64, (size + 63) / 64 * 64);
    if (b.data == nullptr) throw std::bad_alloc();
    b.size = size;
  }
  return b.data;
}

}  // namespace onednn_rt
}  // namespace qpack
