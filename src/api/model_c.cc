// extern "C" surface of packed model files (qpack_model_*, qpack_*_save/_load).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/handle.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/model_file.h"
#include "qpack/qpack.h"

struct qpack_model {
  std::shared_ptr<const qpack::Model> impl;
};

namespace {
namespace api = qpack::api;

std::string path_of(const char* path) {
  qpack::check(path != nullptr && path[0] != '\0', QPACK_STATUS_INVALID_ARGUMENT,
               "path is NULL or empty");
  return path;
}

qpack::LoadOptions options_of(const qpack_load_options* o) {
  qpack::LoadOptions opts;
  if (o != nullptr) {
    opts.map = o->map != 0;
    opts.verify = o->verify != 0;
    opts.strict = o->strict != 0;
  }
  return opts;
}

const qpack::Model& model_of(const qpack_model* m) {
  qpack::check(m != nullptr && m->impl != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
               "model handle is NULL");
  return *m->impl;
}

const qpack::ModelOp& op_at(const qpack::Model& m, int32_t index) {
  qpack::check(index >= 0 && static_cast<size_t>(index) < m.ops.size(),
               QPACK_STATUS_INVALID_ARGUMENT, "op index ", index, " is out of range [0, ",
               m.ops.size(), ")");
  return m.ops[static_cast<size_t>(index)];
}

template <typename H, typename Op>
H* new_handle(std::shared_ptr<const Op> op) {
  auto* h = new H;
  h->impl = std::const_pointer_cast<Op>(std::move(op));
  return h;
}

template <typename H, typename Pick>
qpack_status load_one(const char* path, const qpack_load_options* options, H** out,
                      const char* what, Pick pick) {
  return api::guarded([&] {
    qpack::check(out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "the output handle pointer is NULL");
    *out = nullptr;
    const std::string p = path_of(path);
    auto model = qpack::load_model(p, options_of(options));
    *out = pick(*model, p, what);
  });
}
}  // namespace

extern "C" {

void qpack_load_options_init(qpack_load_options* options) {
  if (options == nullptr) return;
  options->map = 1;
  options->verify = 1;
  options->strict = 0;
}

qpack_status qpack_model_save(const qpack_save_params* params, const char* path) {
  return api::guarded([&] {
    qpack::check(params != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "params is NULL");
    const std::string p = path_of(path);
    const qpack_save_params& s = *params;
    auto counted = [](int32_t n, const void* v, const char* what) {
      qpack::check(n >= 0 && (n == 0 || v != nullptr), QPACK_STATUS_INVALID_ARGUMENT, what,
                   ": a count >= 0 and an array");
    };
    counted(s.num_linears, s.linears, "linears");
    counted(s.num_convs, s.convs, "convs");
    counted(s.num_graphs, s.graphs, "graphs");
    qpack::check(s.host_size == 0 || s.host_data != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "host_data is NULL");
    counted(s.num_data, s.data, "data");
    qpack::check(s.num_data == 0 || s.data_sizes != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "data_sizes is NULL");
    std::vector<qpack::Blob> data;
    for (int32_t i = 0; i < s.num_data; ++i) {
      data.push_back(qpack::Blob{nullptr, static_cast<const uint8_t*>(s.data[i]), s.data_sizes[i]});
    }
    std::vector<qpack::ModelOp> ops;
    for (int32_t i = 0; i < s.num_linears; ++i) ops.push_back({api::live(s.linears[i], "linear"), nullptr});
    for (int32_t i = 0; i < s.num_convs; ++i) ops.push_back({nullptr, api::live(s.convs[i], "convolution")});
    std::vector<std::shared_ptr<const qpack::Graph>> graphs;
    for (int32_t i = 0; i < s.num_graphs; ++i) graphs.push_back(api::live(s.graphs[i], "graph"));
    qpack::save_model(p, std::move(ops), graphs, s.host_data, s.host_size, data,
                      s.with_originals != 0);
  });
}

qpack_status qpack_model_load(const char* path, const qpack_load_options* options,
                              qpack_model** model_out) {
  return api::guarded([&] {
    qpack::check(model_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "model_out is NULL");
    *model_out = nullptr;
    auto model = qpack::load_model(path_of(path), options_of(options));
    *model_out = new qpack_model{std::move(model)};
  });
}

qpack_status qpack_model_load_fd(int fd, const char* name, const qpack_load_options* options,
                                 qpack_model** model_out) {
  return api::guarded([&] {
    qpack::check(model_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "model_out is NULL");
    *model_out = nullptr;
    qpack::check(fd >= 0, QPACK_STATUS_INVALID_ARGUMENT, "fd must be an open file descriptor");
    auto model = qpack::load_model(name != nullptr ? name : "<fd>", options_of(options), fd);
    *model_out = new qpack_model{std::move(model)};
  });
}

void qpack_model_destroy(qpack_model* model) { delete model; }

qpack_status qpack_model_data(const qpack_model* model, int32_t index, const void** data_out,
                              size_t* size_out, uint64_t* offset_out) {
  return api::guarded([&] {
    qpack::check(data_out != nullptr && size_out != nullptr && offset_out != nullptr,
                 QPACK_STATUS_INVALID_ARGUMENT, "data_out, size_out or offset_out is NULL");
    const qpack::Model& m = model_of(model);
    qpack::check(index >= 0 && static_cast<size_t>(index) < m.data.size(),
                 QPACK_STATUS_INVALID_ARGUMENT, "data index ", index, " is out of range [0, ",
                 m.data.size(), ")");
    *data_out = m.data[static_cast<size_t>(index)].data;
    *size_out = m.data[static_cast<size_t>(index)].size;
    *offset_out = m.data_offsets[static_cast<size_t>(index)];
  });
}

qpack_status qpack_model_get_info(const qpack_model* model, qpack_model_info* info_out) {
  return api::guarded([&] {
    qpack::check(info_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "info_out is NULL");
    const qpack::Model& m = model_of(model);
    *info_out = qpack_model_info{};
    info_out->num_ops = static_cast<int32_t>(m.ops.size());
    info_out->num_graphs = static_cast<int32_t>(m.graphs.size());
    info_out->num_repacked = static_cast<int32_t>(m.repacked.size());
    info_out->mapped = m.mapped ? 1 : 0;
    info_out->file_size = m.file_size;
    info_out->nbytes_in_place = m.nbytes_in_place;
    info_out->host_size = m.host.size;
    info_out->num_data = static_cast<int32_t>(m.data.size());
  });
}

qpack_status qpack_model_op_kind(const qpack_model* model, int32_t index, qpack_op_kind* kind_out) {
  return api::guarded([&] {
    qpack::check(kind_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "kind_out is NULL");
    *kind_out = op_at(model_of(model), index).linear ? QPACK_OP_LINEAR : QPACK_OP_CONV2D;
  });
}

qpack_status qpack_model_linear(const qpack_model* model, int32_t index, qpack_linear** linear_out) {
  return api::guarded([&] {
    qpack::check(linear_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "linear_out is NULL");
    *linear_out = nullptr;
    const auto& op = op_at(model_of(model), index);
    qpack::check(op.linear != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "op ", index,
                 " is a convolution, not a linear");
    *linear_out = new_handle<qpack_linear>(op.linear);
  });
}

qpack_status qpack_model_conv2d(const qpack_model* model, int32_t index, qpack_conv2d** conv_out) {
  return api::guarded([&] {
    qpack::check(conv_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "conv_out is NULL");
    *conv_out = nullptr;
    const auto& op = op_at(model_of(model), index);
    qpack::check(op.conv != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "op ", index,
                 " is a linear, not a convolution");
    *conv_out = new_handle<qpack_conv2d>(op.conv);
  });
}

qpack_status qpack_model_graph(const qpack_model* model, int32_t index, qpack_graph** graph_out) {
  return api::guarded([&] {
    qpack::check(graph_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "graph_out is NULL");
    *graph_out = nullptr;
    const qpack::Model& m = model_of(model);
    qpack::check(index >= 0 && static_cast<size_t>(index) < m.graphs.size(),
                 QPACK_STATUS_INVALID_ARGUMENT, "graph index ", index, " is out of range [0, ",
                 m.graphs.size(), ")");
    *graph_out = new_handle<qpack_graph, qpack::Graph>(m.graphs[static_cast<size_t>(index)]);
  });
}

qpack_status qpack_model_host(const qpack_model* model, const void** data_out, size_t* size_out) {
  return api::guarded([&] {
    qpack::check(data_out != nullptr && size_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
                 "data_out or size_out is NULL");
    const qpack::Model& m = model_of(model);
    *data_out = m.host.size > 0 ? m.host.data : nullptr;
    *size_out = m.host.size;
  });
}

qpack_status qpack_model_repacked(const qpack_model* model, int32_t index, char* buf, size_t size) {
  return api::guarded([&] {
    qpack::check(buf != nullptr && size > 0, QPACK_STATUS_INVALID_ARGUMENT, "buffer is NULL");
    const qpack::Model& m = model_of(model);
    qpack::check(index >= 0 && static_cast<size_t>(index) < m.repacked.size(),
                 QPACK_STATUS_INVALID_ARGUMENT, "re-packed index ", index, " is out of range");
    const std::string& s = m.repacked[static_cast<size_t>(index)];
    const size_t n = std::min(s.size(), size - 1);
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  });
}

qpack_status qpack_linear_save(const qpack_linear* linear, const char* path) {
  qpack_save_params p{};
  p.num_linears = 1;
  p.linears = &linear;
  return qpack_model_save(&p, path);
}

qpack_status qpack_conv2d_save(const qpack_conv2d* conv, const char* path) {
  qpack_save_params p{};
  p.num_convs = 1;
  p.convs = &conv;
  return qpack_model_save(&p, path);
}

qpack_status qpack_graph_save(const qpack_graph* graph, const char* path) {
  qpack_save_params p{};
  p.num_graphs = 1;
  p.graphs = &graph;
  return qpack_model_save(&p, path);
}

qpack_status qpack_linear_load(const char* path, const qpack_load_options* options,
                               qpack_linear** linear_out) {
  return load_one(path, options, linear_out, "linear",
                  [](const qpack::Model& m, const std::string& p, const char* what) {
                    qpack::check(m.ops.size() == 1 && m.ops[0].linear, QPACK_STATUS_INVALID_ARGUMENT,
                                 p, " holds ", m.ops.size(), " ops, not one ", what,
                                 "; use qpack_model_load");
                    return new_handle<qpack_linear>(m.ops[0].linear);
                  });
}

qpack_status qpack_conv2d_load(const char* path, const qpack_load_options* options,
                               qpack_conv2d** conv_out) {
  return load_one(path, options, conv_out, "convolution",
                  [](const qpack::Model& m, const std::string& p, const char* what) {
                    qpack::check(m.ops.size() == 1 && m.ops[0].conv, QPACK_STATUS_INVALID_ARGUMENT,
                                 p, " holds ", m.ops.size(), " ops, not one ", what,
                                 "; use qpack_model_load");
                    return new_handle<qpack_conv2d>(m.ops[0].conv);
                  });
}

qpack_status qpack_graph_load(const char* path, const qpack_load_options* options,
                              qpack_graph** graph_out) {
  return load_one(path, options, graph_out, "graph",
                  [](const qpack::Model& m, const std::string& p, const char* what) {
                    qpack::check(!m.graphs.empty(), QPACK_STATUS_INVALID_ARGUMENT, p,
                                 " holds no ", what, "; use qpack_model_load");
                    return new_handle<qpack_graph, qpack::Graph>(m.graphs[0]);
                  });
}

}  // extern "C"
