// extern "C" surface of frozen graphs (qpack_graph_*).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/handle.h"
#include "core/error.h"
#include "core/graph.h"
#include "qpack/qpack.h"


namespace {
namespace api = qpack::api;
constexpr const char* kWhat = "graph";

qpack::GraphNode make_node(const qpack_graph_node& c, int index) {
  qpack::GraphNode n;
  n.kind = c.kind;
  qpack::check(c.num_inputs >= 1 && c.num_inputs <= 8, QPACK_STATUS_INVALID_ARGUMENT, "node ",
               index, " has ", c.num_inputs, " inputs; 1 to 8 are allowed");
  n.in.assign(c.inputs, c.inputs + c.num_inputs);
  n.out = c.output;
  if (c.kind == QPACK_NODE_CONV2D && c.conv != nullptr) n.conv = api::live(c.conv, "convolution");
  if (c.kind == QPACK_NODE_LINEAR && c.linear != nullptr) n.linear = api::live(c.linear, "linear");
  n.kernel[0] = c.kernel_h;
  n.kernel[1] = c.kernel_w;
  n.stride[0] = c.stride_h;
  n.stride[1] = c.stride_w;
  n.pad[0] = c.pad_top;
  n.pad[1] = c.pad_left;
  n.pad[2] = c.pad_bottom;
  n.pad[3] = c.pad_right;
  n.ceil_mode = c.ceil_mode != 0;
  n.count_include_pad = c.count_include_pad != 0;
  n.keepdim = c.keepdim != 0;
  n.act = c.activation;
  n.act_min = c.act_min;
  n.act_max = c.act_max;
  if (c.kind == QPACK_NODE_AFFINE || c.kind == QPACK_NODE_LAYER_NORM) {
    qpack::check(c.affine_scale != nullptr && c.affine_shift != nullptr && c.channels >= 1 &&
                     c.channels <= (int64_t(1) << 24),
                 QPACK_STATUS_INVALID_ARGUMENT, "node ", index, " (",
                 c.kind == QPACK_NODE_AFFINE ? "affine" : "layer_norm",
                 ") needs affine_scale, affine_shift and channels in [1, 2^24]");
    n.affine_scale.assign(c.affine_scale, c.affine_scale + c.channels);
    n.affine_shift.assign(c.affine_shift, c.affine_shift + c.channels);
  }
  // Nodes that copy floats from affine_scale alone (no shift), and what those are.
  const char* held = c.kind == QPACK_NODE_PRELU      ? "prelu) needs its slopes (1 or the input's channels)"
                     : c.kind == QPACK_NODE_CONSTANT ? "constant) needs its values"
                     : c.kind == QPACK_NODE_PERMUTE_ROWS ? "permute_rows) needs its permutation"
                     : c.kind == QPACK_NODE_ATTENTION && c.channels != 0
                         ? "attention) needs its mask (or channels = 0: no mask)"
                         : nullptr;
  if (held != nullptr) {
    qpack::check(c.affine_scale != nullptr && c.channels >= 1 && c.channels <= (int64_t(1) << 24),
                 QPACK_STATUS_INVALID_ARGUMENT, "node ", index, " (", held,
                 " at affine_scale and their count in channels, in [1, 2^24]; got ", c.channels);
    n.affine_scale.assign(c.affine_scale, c.affine_scale + c.channels);
  }
  return n;
}

std::vector<int> indices(const int32_t* v, int32_t n, const char* what) {
  qpack::check(n >= 1 && n <= (1 << 20) && v != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "the graph needs ",
               what, " (1 to 2^20 of them)");
  return std::vector<int>(v, v + n);
}

// What `name` says of node or value `index`, copied into buf (truncated to size - 1).
qpack_status name_of(const qpack_graph* graph, int32_t index, const char* what, char* buf, size_t size,
                     std::string (qpack::Graph::*name)(size_t) const) {
  return api::guarded([&] {
    qpack::check(buf != nullptr && size > 0, QPACK_STATUS_INVALID_ARGUMENT, "buffer is NULL");
    qpack::check(index >= 0, QPACK_STATUS_INVALID_ARGUMENT, what, " index ", index, " is negative");
    const std::string text = ((*api::live(graph, kWhat)).*name)(static_cast<size_t>(index));
    std::strncpy(buf, text.c_str(), size - 1);
    buf[size - 1] = '\0';
  });
}

}  // namespace

extern "C" {

qpack_status qpack_graph_create(const qpack_graph_params* params, qpack_graph** graph_out) {
  return api::guarded([&] {
    qpack::check(params != nullptr && graph_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "params or graph_out is NULL");
    *graph_out = nullptr;
    const qpack_graph_params& p = *params;
    qpack::check(p.num_values >= 1 && p.num_values <= (1 << 20) && p.values != nullptr &&
                     p.num_nodes >= 0 && p.num_nodes <= (1 << 20) &&
                     (p.num_nodes == 0 || p.nodes != nullptr),
                 QPACK_STATUS_INVALID_ARGUMENT, "the graph needs values (1 to 2^20) and nodes");
    std::vector<qpack::GraphValue> values(static_cast<size_t>(p.num_values));
    for (int32_t v = 0; v < p.num_values; ++v) {
      values[v] = qpack::GraphValue{p.values[v].dtype, p.values[v].scale, p.values[v].zero_point};
    }
    std::vector<qpack::GraphNode> nodes;
    nodes.reserve(static_cast<size_t>(p.num_nodes));
    for (int32_t i = 0; i < p.num_nodes; ++i) nodes.push_back(make_node(p.nodes[i], i));
    auto impl = std::make_shared<qpack::Graph>(std::move(values), std::move(nodes),
                                               indices(p.inputs, p.num_inputs, "inputs"),
                                               indices(p.outputs, p.num_outputs, "outputs"));
    auto* handle = new qpack_graph;
    handle->impl = std::move(impl);
    *graph_out = handle;
  });
}

void qpack_graph_destroy(qpack_graph* graph) { delete graph; }

qpack_status qpack_graph_close(qpack_graph* graph) { return api::close(graph, kWhat); }

qpack_status qpack_graph_output_shapes(const qpack_graph* graph, int32_t num_inputs,
                                       const qpack_tensor* inputs, int32_t num_outputs,
                                       qpack_tensor* outputs) {
  return api::guarded([&] {
    api::live(graph, kWhat)->output_shapes(inputs, num_inputs, outputs, num_outputs);
  });
}

qpack_status qpack_graph_run(const qpack_graph* graph, int32_t num_inputs,
                             const qpack_tensor* inputs, int32_t num_outputs,
                             qpack_tensor* outputs) {
  return api::guarded([&] { api::live(graph, kWhat)->run(inputs, num_inputs, outputs, num_outputs); });
}

qpack_status qpack_graph_get_info(const qpack_graph* graph, qpack_graph_info* info_out) {
  return api::guarded([&] {
    qpack::check(graph != nullptr && info_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "graph handle or info_out is NULL");
    *info_out = qpack_graph_info{};
    info_out->closed = 1;
    auto g = std::atomic_load(&graph->impl);
    if (g == nullptr) return;
    info_out->closed = 0;
    info_out->num_values = static_cast<int32_t>(g->num_values());
    info_out->num_nodes = static_cast<int32_t>(g->num_nodes());
    info_out->num_inputs = static_cast<int32_t>(g->num_inputs());
    info_out->num_outputs = static_cast<int32_t>(g->num_outputs());
    info_out->nbytes_packed = g->nbytes_packed();
    info_out->nbytes_workspace = g->nbytes_workspace();
    info_out->nbytes_constants = g->nbytes_constants();
    info_out->plans_built = g->counters().states_built.load();
    info_out->runs = g->counters().runs.load();
  });
}

qpack_status qpack_graph_node_backend(const qpack_graph* graph, int32_t index, char* buf,
                                      size_t size) {
  return name_of(graph, index, "node", buf, size, &qpack::Graph::node_backend);
}

qpack_status qpack_graph_value_layout(const qpack_graph* graph, int32_t index, char* buf, size_t size) {
  return name_of(graph, index, "value", buf, size, &qpack::Graph::value_layout);
}

}  // extern "C"
