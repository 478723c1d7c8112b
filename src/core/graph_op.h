// A backend's own operator for one u8 node of a frozen graph (add, pools,
// clamp, sigmoid, hardswish): the interface the core runs it through, and the
// table of factories a backend fills in (BackendOps::graph, core/registry.h).
//
// The core decides where each node runs: at graph construction it asks the
// graph's backend (the one its static int8 convolutions and linears use) for
// an operator for the node's parameters; at plan time the operator says
// whether it takes the plan's shapes; a node it declines, or that no backend
// operator exists for, runs in the core's own C++ code (core/graph.cc).
#pragma once

#include <cstdint>
#include <memory>

#include "core/quant.h"
#include "qpack/qpack.h"

namespace qpack {

// Logical dims of a graph value (rank-4: N, C, H, W whatever the storage).
struct Shape {
  int rank = 0;
  int64_t d[4] = {0, 0, 0, 0};
  int64_t numel() const;
  bool operator==(const Shape& o) const;
};

// A u8 node as a backend sees it: its kind and parameters, and the
// quantization of its inputs (x; x1 for ADD) and output y.
struct GraphOpDesc {
  qpack_node_kind kind = QPACK_NODE_ADD;
  qpack_activation act = QPACK_ACT_NONE;  // ADD, ACTIVATION
  float act_min = 0, act_max = 0;         // QPACK_ACT_CLAMP
  int64_t kernel[2] = {1, 1}, stride[2] = {1, 1}, pad[4] = {0, 0, 0, 0};  // pools: t, l, b, r
  bool ceil_mode = false, count_include_pad = true;
  QParams x{1.0f, 0}, x1{1.0f, 0}, y{1.0f, 0};
};

// One node's operator. Immutable to its callers: many threads may run it at
// once (an implementation keeps whatever per-run state it needs per run).
class GraphOp {
 public:
  virtual ~GraphOp() = default;
  // Whether it computes x -> y for these shapes (asked once per plan).
  virtual bool accepts(const Shape& x, const Shape& y) const = 0;
  // u8 data, rank-4 values in NHWC; x1 is ADD's second input (else null).
  virtual void run(const Shape& x, const Shape& y, const uint8_t* x0, const uint8_t* x1,
                   uint8_t* out) const = 0;
};

// A backend's graph operators: each factory returns the operator for a node,
// or null when the backend does not take its parameters. A null entry: the
// backend has no such operator.
struct GraphOps {
  using Make = std::unique_ptr<GraphOp> (*)(const GraphOpDesc&);
  Make add = nullptr;              // ADD with no activation, ReLU or clamp
  Make max_pool = nullptr;         // MAXPOOL2D
  Make avg_pool = nullptr;         // AVGPOOL2D
  Make global_avg_pool = nullptr;  // GLOBAL_AVGPOOL
  Make clamp = nullptr;            // ACTIVATION: ReLU or clamp
  Make sigmoid = nullptr;          // ACTIVATION: sigmoid
  Make hardswish = nullptr;        // ACTIVATION: hardswish

  // The factory for desc's kind (and activation), or null.
  Make entry(const GraphOpDesc& desc) const {
    switch (desc.kind) {
      case QPACK_NODE_ADD: return add;
      case QPACK_NODE_MAXPOOL2D: return max_pool;
      case QPACK_NODE_AVGPOOL2D: return avg_pool;
      case QPACK_NODE_GLOBAL_AVGPOOL: return global_avg_pool;
      case QPACK_NODE_ACTIVATION:
        switch (desc.act) {
          case QPACK_ACT_RELU:
          case QPACK_ACT_CLAMP: return clamp;
          case QPACK_ACT_SIGMOID: return sigmoid;
          case QPACK_ACT_HARDSWISH: return hardswish;
          default: return nullptr;
        }
      default: return nullptr;
    }
  }
};

}  // namespace qpack
