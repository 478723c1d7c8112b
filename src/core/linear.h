// The packed linear layer: y [M, N] = x [M, K] @ weight [N, K]^T + bias.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/op.h"
#include "qpack/qpack.h"

namespace qpack {

struct LinearSpec : OpSpec {
  static constexpr OpKind kind = OpKind::linear;
  int64_t K = 0;  // in_features
  int64_t N = 0;  // out_features

  int64_t channels() const { return N; }
  size_t weight_nbytes() const { return static_cast<size_t>(K * N) * weight_elem_size(); }
};

// A backend's packed linear weights. The run entry points check the mode and
// the input parameters once for every backend, count the run, and call the
// backend's do_run_* (never for an empty batch). A backend overrides the
// do_run_* of the modes it registered.
class LinearKernel : public Kernel {
 public:
  using Spec = LinearSpec;
  // F32 and INT8_DYNAMIC: x [M, K] float -> y [M, N] float.
  void run_f32(int64_t M, const float* x, float* y) const;
  // F32: y = act(x W^T + b) with act fused into the backend's kernel (applied
  // before the store) where it can for this M; false, and nothing done, where
  // it cannot: the caller runs run_f32 and applies act itself.
  bool run_f32_fused(int64_t M, const float* x, float* y, qpack_activation act, float lo, float hi) const;
  // INT8_STATIC: x [M, K] uint8 (input_scale, input_zero_point) -> y [M, N]
  // uint8 with the spec's output parameters.
  void run_u8(int64_t M, const uint8_t* x, float input_scale, int32_t input_zero_point,
              uint8_t* y) const;
  const LinearSpec& spec() const { return spec_; }

 protected:
  explicit LinearKernel(const LinearSpec& spec) : spec_(spec) {}
  virtual void do_run_f32(int64_t M, const float* x, float* y) const;
  virtual bool do_run_f32_fused(int64_t, const float*, float*, qpack_activation, float, float) const {
    return false;
  }
  virtual void do_run_u8(int64_t M, const uint8_t* x, float input_scale,
                         int32_t input_zero_point, uint8_t* y) const;

  const LinearSpec spec_;
};
using LinearFactory = std::unique_ptr<LinearKernel> (*)(const LinearSpec&, const void* weight);
using LinearLoader = std::unique_ptr<LinearKernel> (*)(const LinearSpec&, const SavedForm&);

// Validates and normalises a public params struct into a spec (throws qpack::Error).
// weight_given = false: the spec of a saved op, whose params carry no weight.
LinearSpec make_linear_spec(const qpack_linear_params& params, bool weight_given = true);

}  // namespace qpack
