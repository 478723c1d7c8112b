// oneDNN process state: the CPU engine, per-thread streams and scratchpads.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <string>

namespace qpack {
namespace onednn_rt {

const dnnl::engine& engine();
// Stream for the calling thread (streams are not shared across threads).
dnnl::stream& stream();
// Scratchpad for the calling thread, at least `size` bytes (user-mode
// scratchpad: no shared mutable scratch between concurrent runs).
void* scratchpad(size_t size);
// Applies qpack's thread count to the calling thread's OpenMP team.
void apply_num_threads();
std::string describe();
// Copies the values of a blocked oneDNN memory (any number of dimensions,
// nested inner blocks, extra compensation terms ignored) into dense row-major
// order of its logical dims. For layouts oneDNN will not reorder from.
void decode_blocked(const dnnl::memory::desc& md, const void* data, size_t elem_size, void* out);

}  // namespace onednn_rt
}  // namespace qpack
