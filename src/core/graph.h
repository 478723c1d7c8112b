// A frozen graph: typed values and nodes over packed ops, planned once per
// input shape (shapes, buffers by liveness) and run in one call.
//
// Layout: rank-4 values [N, C, H, W] are stored NHWC (channels last), the
// layout both backends' convolutions run without conversion; other ranks are
// row-major. Conversions happen only at the graph's inputs and outputs.
// dtype flows as given: a static int8 convolution writes u8 in its output
// value's parameters, so u8 stays u8 from op to op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cow_cache.h"
#include "core/graph_op.h"
#include "core/op.h"
#include "core/packed_op.h"
#include "qpack/qpack.h"

namespace qpack {

// The last qpack_node_kind and qpack_activation (graph validation and model
// files check against these: appending a kind changes them here only).
constexpr qpack_node_kind kLastNodeKind = QPACK_NODE_PERMUTE_ROWS;
constexpr qpack_activation kLastActivation = QPACK_ACT_TANH;

struct GraphValue {
  qpack_dtype dtype = QPACK_DTYPE_F32;
  float scale = 0;
  int32_t zero_point = 0;
};

struct GraphNode {
  qpack_node_kind kind = QPACK_NODE_CONV2D;
  std::vector<int> in;
  int out = -1;
  std::shared_ptr<const Conv> conv;      // CONV2D, by reference
  std::shared_ptr<const Linear> linear;  // LINEAR, by reference
  // pools; CHANNELS: kernel = {parts, part index}, stride[0] = shuffle groups;
  // CHANNEL_RANGE: kernel = {first channel, count}; LAYER_NORM: kernel[0] = the dim (1 or -1);
  // LINEAR: ceil_mode = per pixel (over dim 1 of a rank-4 value);
  // ADAPTIVE_AVGPOOL2D: kernel = output {H, W}; RESIZE_*: kernel = output {H, W}
  // or {0, 0}, act_min / act_max = scale factors (H, W) or 0, ceil_mode = align_corners
  int64_t kernel[2] = {1, 1}, stride[2] = {1, 1}, pad[4] = {0, 0, 0, 0};  // t, l, b, r
  bool ceil_mode = false, count_include_pad = true, keepdim = true;
  qpack_activation act = QPACK_ACT_NONE;
  float act_min = 0, act_max = 0;  // CLAMP bounds; LEAKY_RELU: act_min = negative slope; LAYER_NORM: eps
  // AFFINE, LAYER_NORM: per channel; PRELU: affine_scale = slopes (1 or C); ATTENTION:
  // affine_scale = the mask ([L][S] or [H][L][S]) or empty; kernel = {H, D}, stride[0] = Dv,
  // pad[0..2] = where q, k and v start in their inputs' rows, stride[1] / pad[3] = from one q / k
  // head to the next and one v head to the next (0: D / Dv), act_min = scale, ceil_mode = causal;
  // CONSTANT: affine_scale = one sample's values, kernel = {rows, columns or 0};
  // PERMUTE_ROWS: affine_scale = the permutation (as given), kernel = the output's {L, 0} or {H, W}
  std::vector<float> affine_scale, affine_shift;
  std::vector<int32_t> rows;  // PERMUTE_ROWS: affine_scale as indices
  // u8 ACTIVATION: output for each input byte; u8 CONSTANT: the table (affine_scale) quantized
  std::vector<uint8_t> lut;
  std::shared_ptr<const GraphOp> backend_op;  // u8 node on the graph's backend's own operator
};

// One plan: what a run with these input shapes computes and where.
struct GraphPlan {
  std::vector<Shape> input_shapes;
  std::vector<qpack_layout> input_layouts;
  std::vector<Shape> shapes;      // per value
  std::vector<size_t> offsets;    // per value: byte offset in the workspace
  std::vector<bool> external;     // per value: a graph input used in the caller's memory
  std::vector<bool> nchw;         // per value: held NCHW (an input its consumers read as it is, a
                                  // quantize of few channels, a planar convolution's output)
  std::vector<bool> nlc;          // per value: a rank-3 [N, C, L] held channels-last ([N, L, C]):
                                  // between 1-D convolutions (nlc_values)
  std::vector<bool> on_backend;   // per node: runs on its backend_op (which takes these shapes)
  // per node: a convolution into which an add is fused as its sum post-op
  // (ConvShape::sum): the add's index; that add: the convolution's; else -1
  std::vector<int> fused_add;
  size_t workspace = 0;
};

class Graph {
 public:
  // Validates types and wiring (throws qpack::Error).
  Graph(std::vector<GraphValue> values, std::vector<GraphNode> nodes, std::vector<int> inputs,
        std::vector<int> outputs);

  void output_shapes(const qpack_tensor* inputs, int num_inputs, qpack_tensor* outputs,
                     int num_outputs) const;
  void run(const qpack_tensor* inputs, int num_inputs, qpack_tensor* outputs,
           int num_outputs) const;

  const std::vector<GraphValue>& values() const { return values_; }
  const std::vector<GraphNode>& nodes() const { return nodes_; }
  const std::vector<int>& inputs() const { return inputs_; }
  const std::vector<int>& outputs() const { return outputs_; }
  size_t num_values() const { return values_.size(); }
  size_t num_nodes() const { return nodes_.size(); }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  size_t nbytes_packed() const;
  size_t nbytes_constants() const;  // the nodes' own copies (qpack_graph_info.nbytes_constants)
  size_t nbytes_workspace() const { return max_workspace_.load(); }
  const Counters& counters() const { return counters_; }
  // Where node i runs: a backend's name ("qnnpack", "onednn": its packed
  // op's kernels or the backend's own operator) or "qpack" (the core's C++
  // code); "qnnpack, qpack for some shapes" when plans made so far differ.
  std::string node_backend(size_t i) const;
  std::string value_layout(size_t v) const;  // qpack_graph_value_layout

 private:
  // The plan for these inputs, once the output count was checked.
  std::shared_ptr<const GraphPlan> plan_for(const qpack_tensor* inputs, int num_inputs,
                                            const qpack_tensor* outputs, int num_outputs) const;
  GraphPlan make_plan(const qpack_tensor* inputs) const;
  Shape infer(const GraphNode& n, const std::vector<Shape>& shapes) const;
  // Whether convolution node n runs on planar (NCHW) fp32 data at these
  // shapes at least as fast as on channels-last (ConvKernel::fast_on_nchw_f32).
  bool planar_conv(const GraphNode& n, const std::vector<Shape>& shapes) const;
  // Sets plan->fused_add: residual adds their convolution runs as its sum post-op.
  void fuse_adds(GraphPlan* plan) const;
  void nlc_values(GraphPlan* plan) const;
  // How convolution node n runs in plan: its layouts, its f32 activation, and
  // add node `add` fused in (ConvShape::sum) where add >= 0.
  ConvShape conv_shape(const GraphNode& n, const GraphPlan& plan, int add) const;
  void run_node(const GraphNode& n, const GraphPlan& plan, uint8_t* const* ptrs) const;
  void run_attention(const GraphNode& n, const GraphPlan& plan, uint8_t* const* ptrs) const;
  // The backend of the static int8 ops (when they agree) and its operators
  // for the u8 nodes it takes (GraphNode::backend_op).
  void attach_backend_ops();

  std::vector<GraphValue> values_;
  std::vector<GraphNode> nodes_;
  std::vector<int> inputs_, outputs_;
  qpack_backend backend_ = QPACK_BACKEND_AUTO;  // AUTO: no static int8 op, or mixed backends
  mutable Counters counters_;  // states_built: plans; runs
  mutable std::atomic<size_t> max_workspace_{0};
  CowCache<GraphPlan> plans_{8, &counters_};
};

}  // namespace qpack
