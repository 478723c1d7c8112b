// oneDNN's shared machinery in qpack: the engine, per-thread streams and
// buffers, primitive attributes, runtime quantization arguments, the bounded
// primitive cache, and the inverse of a blocked layout. Every oneDNN op file
// (linear.cc, conv.cc) builds on this one.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cow_cache.h"
#include "core/error.h"
#include "core/op.h"
#include "core/policy.h"
#include "core/registry.h"

namespace qpack {
namespace onednn_rt {

// The registry entry (backends/registry.cc), and the op factories it lists.
BackendOps ops();
std::unique_ptr<LinearKernel> make_linear(const LinearSpec& spec, const void* weight);
std::unique_ptr<ConvKernel> make_conv(const ConvSpec& spec, const void* weight);
std::unique_ptr<LinearKernel> load_linear(const LinearSpec& spec, const SavedForm& form);
std::unique_ptr<ConvKernel> load_conv(const ConvSpec& spec, const SavedForm& form);
// The packing code's identity and the ISA it packs for (model file header).
std::string build_id();
std::string isa_name();

const dnnl::engine& engine();
// Stream for the calling thread (streams are not shared across threads).
dnnl::stream& stream();
// Per-thread buffers of the calling thread, at least `size` bytes, 64-byte
// aligned, growing and never shrinking: the user-mode scratchpad (no shared
// mutable scratch between concurrent runs), int8_split.h's buffer, the
// channels-last copies of a convolution's input and output, and the pixels a
// strided 1x1 convolution reads (conv.cc).
enum class ThreadBuffer { scratchpad = 0, split, nhwc_src, nhwc_dst, subsample, count };
void* thread_buffer(ThreadBuffer which, size_t size);
// True when the effective ISA (after ONEDNN_MAX_CPU_ISA) has VNNI or AMX, so
// oneDNN's u8 x s8 int8 kernels do not saturate (see int8_split.h).
bool isa_has_vnni();
// True when the effective ISA (after ONEDNN_MAX_CPU_ISA) is AVX-512 with VNNI:
// qpack's own kernels (depthwise_u8.h) may use it too.
bool isa_has_avx512_vnni();
// True when the effective ISA is AVX2 or above (AVX2 VNNI, AVX-512).
bool isa_has_avx2();
// True when the effective ISA is AVX-512 (core, or with VNNI and beyond).
bool isa_has_avx512_core();
// Applies qpack's thread count to the calling thread's OpenMP team.
void apply_num_threads();
std::string describe();

// How a primitive takes its quantization parameters.
enum class Quant {
  none,        // f32
  split,       // int8 without VNNI: source zero point only, s32 out, epilogue in C++
  dynamic,     // u8 x s8 -> f32: source scale and zero point, weight scales
  static_out,  // u8 x s8 -> u8: as dynamic, plus destination scale and zero point
};
Quant quant_of(const OpSpec& spec, bool split);

// Which zero points a static int8 primitive takes at run time. A zero point
// that is 0 for a run can be left out: oneDNN's AVX2 int8 convolutions run
// faster without (3x3 64->64 @56², one thread, Zen 3: 1926 -> 1595 us without
// both; 256->256 @14²: 2663 -> 1710).
enum ZeroPoints { kSrcZp = 1, kDstZp = 2, kBothZp = 3 };

// Attributes of a qpack primitive, set by name: a user-mode scratchpad
// always; runtime scales and zero points by Quant (those of `zps` only); the
// fused clamp as a post-op (not in split mode: the epilogue clamps).
dnnl::primitive_attr make_attr(Quant quant, int wei_scale_mask, float clamp_min,
                               float clamp_max, int zps = kBothZp);
// True when s8 layout `a` has no extra terms and is `b` up to b's extra terms
// at the end (compensations): a weight packed for a primitive with a source
// zero point serves one without, through a memory of `a` over its bytes.
bool same_blocking(const dnnl::memory::desc& a, const dnnl::memory::desc& b);

// oneDNN's eltwise algorithm and (alpha, beta) for a qpack activation as the
// graph computes it (lo / hi: clamp bounds, leaky_relu's slope); false for
// none or one oneDNN has no eltwise for.
bool eltwise_of(qpack_activation act, float lo, float hi, dnnl::algorithm* alg, float* alpha, float* beta);

// Whether oneDNN picked one of its reference implementations (named "ref:...").
inline bool is_reference(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

// Quantization parameters of one run.
struct RunQuant {
  float src_scale;
  int32_t src_zp;
  float dst_scale;
  int32_t dst_zp;
};
// The arguments of one execution, without allocating: C handles of memories
// that the caller keeps alive until execute returns.
class ExecArgs {
 public:
  void add(int arg, const dnnl::memory& m) {
    check(n_ < kMax, QPACK_STATUS_INTERNAL, "too many oneDNN arguments");
    args_[n_++] = dnnl_exec_arg_t{arg, m.get()};
  }
  int size() const { return n_; }
  const dnnl_exec_arg_t* data() const { return args_; }

 private:
  static constexpr int kMax = 16;
  dnnl_exec_arg_t args_[kMax];
  int n_ = 0;
};

// A memory over `count` constant floats (weight scales), made once per op.
dnnl::memory constant_f32(const float* values, int64_t count);
// Adds q's runtime arguments for `quant` (as make_attr declared them): the
// scalars through the calling thread's own memories, the weight scales
// through wei_scales (constant_f32).
void add_quant_args(ExecArgs& args, Quant quant, const RunQuant& q, const dnnl::memory& wei_scales,
                    int zps = kBothZp);
// The zero points a run needs: for a static run (Quant::static_out) those of
// q that are not 0; every other run keeps them all.
int needed_zero_points(Quant quant, const RunQuant* q);

// Executes a primitive on the calling thread's stream with qpack's thread
// count and the calling thread's scratchpad (scratch_size bytes); a oneDNN
// error becomes BACKEND_ERROR naming `what`.
void execute(const dnnl::primitive& prim, ExecArgs& args, size_t scratch_size, const char* what);
// Reorders src into dst on the calling thread's stream.
void reorder(const dnnl::memory& src, const dnnl::memory& dst);

// A blocked layout as plain numbers: what a model file stores of a packed
// weight's memory descriptor (docs/FORMAT.md, "oneDNN layout"), compared
// field by field with the layout this machine's kernels want.
struct BlockedLayout {
  static constexpr int kMaxDims = 6;
  uint32_t data_type = 0;
  uint32_t split = 0;  // packed for int8 without VNNI
  int32_t ndims = 0;
  int64_t dims[kMaxDims] = {}, strides[kMaxDims] = {};
  int32_t nblks = 0;
  int64_t blks[kMaxDims] = {}, idxs[kMaxDims] = {};
  uint64_t size = 0;
  // The problem the layout was chosen for: a convolution's channels-last
  // N, H, W; a linear's batch, 0, 0. Not part of the comparison.
  int64_t problem[3] = {0, 0, 0};

  static BlockedLayout of(const dnnl::memory::desc& md, bool split);
  std::vector<uint8_t> bytes() const;
  // Parses and checks the numbers (counts, indices, every element offset
  // inside `size`); FILE_FORMAT naming `what` otherwise.
  static BlockedLayout parse(const std::vector<uint8_t>& bytes, const std::string& what);
  bool operator==(const BlockedLayout& o) const;
  // Elements from the start to past the last one the layout addresses
  // (padding included; trailing compensation terms excluded).
  int64_t span() const;
  std::string str() const;  // "f32 [64, 576] blocked 16x..." in messages
};
// Copies the values of a blocked layout (any number of dimensions, nested
// inner blocks, extra compensation terms ignored) into dense row-major order
// of its logical dims. For layouts oneDNN will not reorder from, and for
// packed weights saved by another build.
void decode_blocked(const BlockedLayout& layout, const void* data, size_t elem_size, void* out);
void decode_blocked(const dnnl::memory::desc& md, const void* data, size_t elem_size, void* out);
// Reads packed weights back into `plain` (their plain layout): a reorder, or
// decode_blocked where oneDNN will not reorder (int8 compensation terms).
void unpack(const dnnl::memory& packed, const dnnl::memory& plain, size_t elem_size);

// Primitives of one packed op, created per run shape and thread count
// (oneDNN fixes a primitive's parallel split at creation): a CowCache whose
// entries carry the thread count they were built for.
template <typename Prim>
struct Threaded {
  int threads;
  Prim prim;
};
template <typename Prim>
class PrimCache {
 public:
  using Ptr = typename CowCache<Threaded<Prim>>::Ptr;

  PrimCache(Counters& counters, size_t capacity) : cache_(capacity, &counters) {}

  // The primitive for which matches(prim) holds at this thread count, or the
  // one build() makes (under the cache's lock; build may throw).
  // keep(old, fresh) says whether an older primitive stays once `fresh` is added.
  template <typename Matches, typename Build, typename Keep>
  Ptr get(const Matches& matches, const Build& build, const Keep& keep) const {
    const int threads = num_threads();
    return cache_.get(
        [&](const Threaded<Prim>& e) { return e.threads == threads && matches(e.prim); },
        [&] {
          apply_num_threads();
          return Threaded<Prim>{threads, build()};
        },
        [&](const Threaded<Prim>& old, const Threaded<Prim>& fresh) {
          return keep(old.prim, fresh.prim);
        });
  }

  std::vector<Ptr> entries() const { return cache_.entries(); }

 private:
  CowCache<Threaded<Prim>> cache_;
};

}  // namespace onednn_rt
}  // namespace qpack
