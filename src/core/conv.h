// The packed 2-D convolution: spec (what the user asked for), an immutable
// packed kernel per backend, and the original weights while they are retained.
// Conv1d is this op with height 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/linear.h"  // LinearCounters
#include "core/layer.h"
#include "qpack/qpack.h"

namespace qpack {

// Everything about a convolution except the weight values. Immutable once
// the object is built. The weight is [OC, IC / groups, KH, KW].
struct ConvSpec {
  int64_t IC = 0, OC = 0, groups = 1;
  int64_t KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  int64_t dil_h = 1, dil_w = 1;
  qpack_mode mode = QPACK_MODE_F32;
  qpack_backend backend = QPACK_BACKEND_AUTO;
  std::vector<float> weight_scales;         // int8: 1 or OC
  std::vector<int32_t> weight_zero_points;  // int8: same length as scales
  std::vector<float> bias;                  // empty or OC
  float clamp_min = 0, clamp_max = 0;       // real domain; +-inf when absent
  float input_scale = 0;                    // static: expected (0 = unknown)
  int32_t input_zero_point = 0;
  float output_scale = 0;
  int32_t output_zero_point = 0;

  int64_t icg() const { return IC / groups; }
  int64_t ocg() const { return OC / groups; }
  bool per_channel() const { return weight_scales.size() > 1; }
  float weight_scale(int64_t n) const { return weight_scales[per_channel() ? n : 0]; }
  int32_t weight_zero_point(int64_t n) const {
    return weight_zero_points[per_channel() ? n : 0];
  }
  size_t weight_elem_size() const { return mode == QPACK_MODE_F32 ? 4 : 1; }
  int64_t weight_count() const { return OC * icg() * KH * KW; }
  size_t weight_nbytes() const { return static_cast<size_t>(weight_count()) * weight_elem_size(); }
  // Output size for an input size; throws INVALID_ARGUMENT when the (padded)
  // input is smaller than the dilated kernel.
  void output_size(int64_t H, int64_t W, int64_t* OH, int64_t* OW) const;
};

// One run's geometry: batch, input size, memory layouts of x and y.
struct ConvShape {
  int64_t N, H, W, OH, OW;
  qpack_layout x_layout, y_layout;
};

// A backend's packed weights. Every method is const and safe to call from
// many threads at once.
class ConvKernel {
 public:
  virtual ~ConvKernel() = default;
  virtual void run_f32(const ConvShape& s, const float* x, float* y) const;
  virtual void run_u8(const ConvShape& s, const uint8_t* x, float input_scale,
                      int32_t input_zero_point, uint8_t* y) const;
  // Writes the weight [OC, IC/g, KH, KW] (float or int8 by mode) from the packed form.
  virtual void unpack_weight(void* out) const = 0;
  virtual size_t nbytes_packed() const = 0;

  LinearCounters& counters() const { return counters_; }

 protected:
  mutable LinearCounters counters_;
};

std::unique_ptr<ConvKernel> make_onednn_conv(const ConvSpec& spec, const void* weight);
std::unique_ptr<ConvKernel> make_qnnpack_conv(const ConvSpec& spec, const void* weight);

// The object behind a qpack_conv2d handle. Thread-safe.
class Conv {
 public:
  Conv(ConvSpec spec, const void* weight, bool retain);

  const ConvSpec& spec() const { return spec_; }
  const ConvKernel& kernel() const { return *kernel_; }

  void release_original();
  bool has_original() const;
  size_t nbytes_original() const;
  void unpack(void* weight_out, float* bias_out) const;

 private:
  ConvSpec spec_;
  std::unique_ptr<ConvKernel> kernel_;
  OriginalWeights original_;
};

// Validates and normalises a public params struct into a spec (throws qpack::Error).
ConvSpec make_conv_spec(const qpack_conv2d_params& params);

// Copies an NHWC uint8 image [N, SH, SW, C] (rows dy.., cols dx..) into
// [N, OH, OW, C] in `layout`; used to crop and to change layout.
void copy_nhwc_u8(const uint8_t* src, int64_t N, int64_t SH, int64_t SW, int64_t C, int64_t dy,
                  int64_t dx, int64_t OH, int64_t OW, qpack_layout layout, uint8_t* dst);

}  // namespace qpack
