// The backend registry: which backends this build has, what each can do,
// and the factories of their kernels. api/ and core/ ask it for a kernel and
// never include a backend header; the list itself is src/backends/registry.cc,
// the one file that names every backend (as oneDNN's cpu_matmul_list.cpp).
//
// To add a backend: a folder src/backends/<name>/ with one file per op and a
// <name>_ops() in its runtime; one line in backends/registry.cc; its sources
// and option in src/CMakeLists.txt.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/conv.h"
#include "core/graph_op.h"
#include "core/linear.h"
#include "qpack/qpack.h"

namespace qpack {

// One op on one backend: the modes it supports (bit 1 << qpack_mode), its
// factory, and its loader (a kernel over packed bytes saved in a model file).
template <typename KernelT>
struct OpSupport {
  using Spec = typename KernelT::Spec;
  unsigned modes = 0;
  std::unique_ptr<KernelT> (*make)(const Spec&, const void* weight) = nullptr;
  std::unique_ptr<KernelT> (*load)(const Spec&, const SavedForm&) = nullptr;
  bool supports(qpack_mode mode) const { return make != nullptr && (modes & (1u << mode)); }
};

// What a compiled-in backend provides. Default-constructed: not in this build.
struct BackendOps {
  bool (*available)() = nullptr;     // usable on this CPU (initialises on first call)
  std::string (*describe)() = nullptr;
  bool asymmetric_weights = false;   // int8 weights may have nonzero zero points
  // Identifies the packing code (library version and qpack's packing) and
  // the ISA packed layouts are made for here: a model file's header records
  // both (docs/FORMAT.md).
  std::string (*build_id)() = nullptr;
  std::string (*isa)() = nullptr;
  // The largest u8 input its static int8 kernels take at full speed (255; 127
  // where wider inputs run at twice the work, oneDNN without VNNI: int8_split.h).
  int (*int8_input_max)() = nullptr;
  OpSupport<LinearKernel> linear;
  OpSupport<ConvKernel> conv2d;
  // Its own operators for u8 graph nodes (add, pools, activations): graphs
  // whose static int8 ops run on this backend run those nodes on them.
  GraphOps graph;
};

struct Backend {
  qpack_backend id;
  const char* name;     // what users pass: "onednn"
  const char* display;  // in messages: "oneDNN"
  BackendOps ops;

  bool compiled() const { return ops.available != nullptr; }
  bool available() const { return compiled() && ops.available(); }
  template <typename KernelT>
  const OpSupport<KernelT>& support() const;
};
template <>
inline const OpSupport<LinearKernel>& Backend::support<LinearKernel>() const { return ops.linear; }
template <>
inline const OpSupport<ConvKernel>& Backend::support<ConvKernel>() const { return ops.conv2d; }

// Every backend qpack knows, in AUTO preference order (defined in backends/registry.cc).
const std::vector<Backend>& backends();
// The entry of a backend id; throws INVALID_ARGUMENT for an unknown id.
const Backend& backend(qpack_backend id);
// Modes of `op` on b, as a bit set (1 << qpack_mode).
unsigned op_modes(const Backend& b, OpKind op);
// AUTO: the first available backend with (op, mode), and one that takes
// asymmetric weights when the int8 weight has zero points; otherwise the
// requested one, which must be compiled in and support (op, mode). Throws
// UNSUPPORTED with the backends that would do.
qpack_backend resolve_backend(qpack_backend requested, OpKind op, qpack_mode mode,
                              bool asymmetric_weights = false);

}  // namespace qpack
