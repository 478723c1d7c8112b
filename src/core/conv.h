// The packed 2-D convolution (cross-correlation, like F.conv2d); Conv1d is
// this op with height 1. The weight is [OC, IC / groups, KH, KW].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/op.h"
#include "qpack/qpack.h"

namespace qpack {

struct ConvSpec : OpSpec {
  static constexpr OpKind kind = OpKind::conv2d;
  int64_t IC = 0, OC = 0, groups = 1;
  int64_t KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  int64_t dil_h = 1, dil_w = 1;

  int64_t channels() const { return OC; }
  int64_t icg() const { return IC / groups; }
  int64_t ocg() const { return OC / groups; }
  bool depthwise() const { return icg() == 1 && ocg() == 1; }
  bool padded() const { return pad_t || pad_l || pad_b || pad_r; }
  int64_t weight_count() const { return OC * icg() * KH * KW; }
  size_t weight_nbytes() const { return static_cast<size_t>(weight_count()) * weight_elem_size(); }
  // Output size for an input size; throws INVALID_ARGUMENT when the (padded)
  // input is smaller than the dilated kernel.
  void output_size(int64_t H, int64_t W, int64_t* OH, int64_t* OW) const;
};

// One run's geometry: batch, input size, memory layouts of x and y; for f32
// runs an activation applied after the layer's own (a frozen graph's
// activation node fused into the convolution; act_min / act_max as the
// graph node's: clamp bounds, leaky_relu's slope).
// sum (where the kernel fuses_sum): y holds a value of the output's shape and
// layout on entry and the run leaves sum_act(post_act(conv(x)) + y) there: a
// graph's residual add (and its activation) as the convolution's sum
// post-op. u8: y's values on entry are in (sum_scale, sum_zp), the result is
// quantized to (out_scale, out_zp) instead of the layer's output parameters,
// and the convolution's own result is never rounded to u8 on the way.
struct ConvShape {
  int64_t N, H, W, OH, OW;
  qpack_layout x_layout, y_layout;
  qpack_activation post_act = QPACK_ACT_NONE;
  float post_min = 0.0f, post_max = 0.0f;
  bool sum = false;
  qpack_activation sum_act = QPACK_ACT_NONE;
  float sum_min = 0.0f, sum_max = 0.0f;
  float sum_scale = 1.0f, out_scale = 1.0f;
  int32_t sum_zp = 0, out_zp = 0;
};

// A backend's packed convolution weights; run entry points as LinearKernel's.
class ConvKernel : public Kernel {
 public:
  using Spec = ConvSpec;
  // F32: x float -> y float.
  void run_f32(const ConvShape& s, const float* x, float* y) const;
  // INT8_STATIC: x uint8 (input_scale, input_zero_point) -> y uint8.
  void run_u8(const ConvShape& s, const uint8_t* x, float input_scale, int32_t input_zero_point,
              uint8_t* y) const;
  const ConvSpec& spec() const { return spec_; }
  // Whether run_f32 applies `act` as ConvShape::post_act (none: every kernel).
  virtual bool fuses_f32(qpack_activation act) const { return act == QPACK_ACT_NONE; }
  // Whether run_f32 / run_u8 take this shape with sum set (its post_act,
  // sum_act included): no kernel but where it says so.
  virtual bool fuses_sum(const ConvShape&) const { return false; }
  // Whether run_f32 reads and writes planar (NCHW) data for this shape at
  // least as fast as channels-last data with transposes around it (a graph
  // then keeps such an input, and an output only the caller reads, NCHW).
  virtual bool fast_on_nchw_f32(const ConvShape&) const { return false; }

 protected:
  explicit ConvKernel(const ConvSpec& spec) : spec_(spec) {}
  virtual void do_run_f32(const ConvShape& s, const float* x, float* y) const;
  virtual void do_run_u8(const ConvShape& s, const uint8_t* x, float input_scale,
                         int32_t input_zero_point, uint8_t* y) const;

  const ConvSpec spec_;
};
using ConvFactory = std::unique_ptr<ConvKernel> (*)(const ConvSpec&, const void* weight);
using ConvLoader = std::unique_ptr<ConvKernel> (*)(const ConvSpec&, const SavedForm&);

// Validates and normalises a public params struct into a spec (throws qpack::Error).
// weight_given = false: the spec of a saved op, whose params carry no weight.
ConvSpec make_conv_spec(const qpack_conv2d_params& params, bool weight_given = true);

}  // namespace qpack
