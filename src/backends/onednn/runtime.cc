#include "backends/onednn/runtime.h"

#include <omp.h>

#include <cstdlib>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/policy.h"

namespace qpack {
namespace onednn_rt {
namespace {
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
struct Scratch {
  std::unique_ptr<void, FreeDeleter> data;
  size_t size = 0;
};
thread_local Scratch t_scratch;
thread_local std::unique_ptr<dnnl::stream> t_stream;

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "other";
  }
}
}  // namespace

const dnnl::engine& engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& stream() {
  if (!t_stream) t_stream = std::make_unique<dnnl::stream>(engine());
  return *t_stream;
}

void* scratchpad(size_t size) {
  if (size == 0) return nullptr;
  if (t_scratch.size < size) {
    void* p = nullptr;
    check(posix_memalign(&p, 64, size) == 0 && p != nullptr, QPACK_STATUS_OUT_OF_MEMORY,
          "could not allocate a ", size, "-byte oneDNN scratchpad");
    t_scratch.data.reset(p);
    t_scratch.size = size;
  }
  return t_scratch.data.get();
}

void apply_num_threads() {
  int n = num_threads();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

std::string describe() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << "oneDNN " << v->major << "." << v->minor << "." << v->patch << " (" << v->hash
     << "); cpu_runtime=OpenMP; isa=" << isa_name(dnnl::get_effective_cpu_isa());
  return os.str();
}

}  // namespace onednn_rt
}  // namespace qpack
