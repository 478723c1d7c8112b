// The packed linear layer: spec (what the user asked for), an immutable packed
// kernel per backend, and the original weights while they are retained.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/layer.h"
#include "qpack/qpack.h"

namespace qpack {

// Everything about a linear layer except the weight values. Immutable once
// the layer is built.
struct LinearSpec {
  int64_t K = 0;  // in_features
  int64_t N = 0;  // out_features
  qpack_mode mode = QPACK_MODE_F32;
  qpack_backend backend = QPACK_BACKEND_AUTO;
  std::vector<float> weight_scales;        // int8: 1 or N
  std::vector<int32_t> weight_zero_points;  // int8: same length as scales
  std::vector<float> bias;                  // empty or N
  float clamp_min = 0, clamp_max = 0;       // real domain; +-inf when absent
  float input_scale = 0;                    // static: expected (0 = unknown)
  int32_t input_zero_point = 0;
  float output_scale = 0;
  int32_t output_zero_point = 0;

  bool per_channel() const { return weight_scales.size() > 1; }
  float weight_scale(int64_t n) const { return weight_scales[per_channel() ? n : 0]; }
  int32_t weight_zero_point(int64_t n) const {
    return weight_zero_points[per_channel() ? n : 0];
  }
  size_t weight_elem_size() const { return mode == QPACK_MODE_F32 ? 4 : 1; }
  size_t weight_nbytes() const { return static_cast<size_t>(K * N) * weight_elem_size(); }
};

struct LinearCounters {
  std::atomic<uint64_t> states_built{0};
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> runs{0};
};

// A backend's packed weights. Every method is const and safe to call from
// many threads at once; a kernel that needs per-input state (QNNPACK's int32
// bias) builds it copy-on-write from its own packed form.
class LinearKernel {
 public:
  virtual ~LinearKernel() = default;
  virtual void run_f32(int64_t M, const float* x, float* y) const;
  virtual void run_u8(int64_t M, const uint8_t* x, float input_scale, int32_t input_zero_point,
                      uint8_t* y) const;
  // Writes the weight [N, K] (float or int8 by mode), reconstructed from the packed form.
  virtual void unpack_weight(void* out) const = 0;
  virtual size_t nbytes_packed() const = 0;

  LinearCounters& counters() const { return counters_; }

 protected:
  mutable LinearCounters counters_;
};

std::unique_ptr<LinearKernel> make_onednn_linear(const LinearSpec& spec, const void* weight);
std::unique_ptr<LinearKernel> make_qnnpack_linear(const LinearSpec& spec, const void* weight);

// The object behind a qpack_linear handle. Thread-safe.
class Linear {
 public:
  Linear(LinearSpec spec, const void* weight, bool retain);

  const LinearSpec& spec() const { return spec_; }
  const LinearKernel& kernel() const { return *kernel_; }

  void release_original();
  bool has_original() const;
  size_t nbytes_original() const;
  void unpack(void* weight_out, float* bias_out) const;

 private:
  LinearSpec spec_;
  std::unique_ptr<LinearKernel> kernel_;
  OriginalWeights original_;
};

// Validates and normalises a public params struct into a spec (throws qpack::Error).
LinearSpec make_linear_spec(const qpack_linear_params& params);

}  // namespace qpack
