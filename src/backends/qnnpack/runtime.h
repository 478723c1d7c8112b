// QNNPACK's shared machinery in qpack: one-time initialisation, per-thread
// thread pools, the padded per-channel weight quantization its kernels read,
// and the registry entry. Every QNNPACK op file builds on this one (and on
// states.h for the copy-on-write packed states).
#pragma once

#include <pthreadpool.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/conv.h"
#include "core/linear.h"
#include "core/op.h"
#include "core/op.h"
#include "core/registry.h"

namespace qpack {
namespace qnnpack_rt {

// The registry entry (backends/registry.cc), and the op factories it lists.
BackendOps ops();
std::unique_ptr<LinearKernel> make_linear(const LinearSpec& spec, const void* weight);
std::unique_ptr<ConvKernel> make_conv(const ConvSpec& spec, const void* weight);
std::unique_ptr<LinearKernel> load_linear(const LinearSpec& spec, const SavedForm& form);
std::unique_ptr<ConvKernel> load_conv(const ConvSpec& spec, const SavedForm& form);
// QNNPACK's own operators for u8 graph nodes (graph_ops.cc).
GraphOps graph_ops();
// The packing code's identity and the ISA it packs for (model file header).
std::string build_id();
std::string isa_name();

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

// Per-output-channel weight zero points (uint8: int8 + 128, as PyTorch
// gives QNNPACK) and scales, padded to `padded` entries as QNNPACK's kernels
// read past the last channel (padding: zero point 128, scale 1).
struct WeightQuant {
  WeightQuant(const OpSpec& spec, int64_t channels, int64_t padded);
  std::vector<uint8_t> zero_points;
  std::vector<float> scales;
  size_t nbytes() const { return zero_points.size() + scales.size() * sizeof(float); }
};

// A packed layout as a model file stores it (docs/FORMAT.md, "QNNPACK layout").
struct QLayout {
  enum Kind : uint32_t { linear = 0, dwconv = 1, gemm = 2, conv = 3 };
  uint32_t kind = linear, nr = 0, kr = 0, cr = 0;
  uint64_t packed_size = 0;
  float bias_input_scale = 0;  // the input scale of the int32 bias slots (0: not filled)

  std::vector<uint8_t> bytes() const;
  // Parses and range-checks the numbers; FILE_FORMAT naming `what` otherwise.
  static QLayout parse(const std::vector<uint8_t>& bytes, const std::string& what);
  // Same kind, blocking and size (the bias input scale may differ).
  bool same_blocking(const QLayout& o) const;
  std::string str() const;
};

// int8 -> uint8 (+128), the weight convention of QNNPACK's kernels.
inline uint8_t to_qnnpack_u8(int8_t w) { return static_cast<uint8_t>(static_cast<int32_t>(w) + 128); }
inline int8_t from_qnnpack_u8(uint8_t w) { return static_cast<int8_t>(static_cast<int32_t>(w) - 128); }

}  // namespace qnnpack_rt
}  // namespace qpack
