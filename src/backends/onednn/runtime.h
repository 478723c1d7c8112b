// oneDNN process state: the CPU engine, per-thread streams and scratchpads.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace qpack {
namespace onednn_rt {

const dnnl::engine& engine();
// Stream for the calling thread (streams are not shared across threads).
dnnl::stream& stream();
// Per-thread buffers of the calling thread, at least `size` bytes, 64-byte
// aligned, growing and never shrinking: the user-mode scratchpad (no shared
// mutable scratch between concurrent runs) and int8_split.h's buffer.
enum class ThreadBuffer { scratchpad = 0, split = 1 };
void* thread_buffer(ThreadBuffer which, size_t size);
inline void* scratchpad(size_t size) { return thread_buffer(ThreadBuffer::scratchpad, size); }
// True when the effective ISA (after ONEDNN_MAX_CPU_ISA) has VNNI or AMX, so
// oneDNN's u8 x s8 int8 kernels do not saturate (see int8_split.h).
bool isa_has_vnni();
// Applies qpack's thread count to the calling thread's OpenMP team.
void apply_num_threads();
std::string describe();

// Quantization parameters of one int8 run.
// Attributes of a qpack primitive: user scratchpad; for int8, runtime scales
// and zero points (weight scales with `wei_scale_mask`; destination ones only
// when `static_out`); the fused clamp as a post-op. In split mode (int8
// without VNNI) only the source zero point: the epilogue does the rest.
dnnl::primitive_attr make_attr(bool int8, bool split, bool static_out, int wei_scale_mask,
                               float clamp_min, float clamp_max);

struct RunQuant {
  float src_scale;
  int32_t src_zp;
  float dst_scale;
  int32_t dst_zp;
};
// Adds q's runtime arguments to a primitive's: the source zero point always;
// with `scales`, the source and weight scales; with `dst`, the destination's
// scale and zero point too. The memories point into q and wei_scales, which
// must outlive the execution.
void add_quant_args(std::unordered_map<int, dnnl::memory>& args, const RunQuant& q,
                    const std::vector<float>& wei_scales, bool scales, bool dst);

// Copies the values of a blocked oneDNN memory (any number of dimensions,
// nested inner blocks, extra compensation terms ignored) into dense row-major
// order of its logical dims. For layouts oneDNN will not reorder from.
void decode_blocked(const dnnl::memory::desc& md, const void* data, size_t elem_size, void* out);

}  // namespace onednn_rt
}  // namespace qpack
