// PackedOp: the lifetime holder behind every C handle of a packed op.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "core/conv.h"
#include "core/error.h"
#include "core/linear.h"
#include "core/op.h"
#include "core/registry.h"

namespace qpack {

// Spec, kernel (made by the spec's backend through the registry) and the
// original weights while retained. Thread-safe: runs go to kernel(), which is
// immutable; the original weights have their own lock.
template <typename KernelT>
class PackedOp {
 public:
  using Spec = typename KernelT::Spec;

  PackedOp(Spec spec, const void* weight, bool retain) : spec_(std::move(spec)) {
    kernel_ = backend(spec_.backend).template support<KernelT>().make(spec_, weight);
    if (retain) original_.keep(weight, spec_.weight_nbytes());
  }
  // An op loaded from a model file: its packed form, and the original weight
  // when the file kept it (a view of spec_.weight_nbytes() bytes, else empty).
  PackedOp(Spec spec, const SavedForm& form, const Blob& original) : spec_(std::move(spec)) {
    const auto& support = backend(spec_.backend).template support<KernelT>();
    check(support.load != nullptr, QPACK_STATUS_UNSUPPORTED, form.what,
          " cannot be loaded: its backend cannot load saved ", op_name(Spec::kind), "s");
    kernel_ = support.load(spec_, form);
    if (original.size > 0) original_.keep_view(original);
  }

  const Spec& spec() const { return spec_; }
  const KernelT& kernel() const { return *kernel_; }

  void release_original() { original_.release(); }
  bool has_original() const { return original_.held(); }
  size_t nbytes_original() const { return original_.nbytes(); }
  // The original if held, else reconstructed from the packed form; either may be null.
  void unpack(void* weight_out, float* bias_out) const {
    if (weight_out != nullptr && !original_.copy_to(weight_out)) kernel_->unpack_weight(weight_out);
    if (bias_out != nullptr) copy_bias(spec_.bias, spec_.channels(), bias_out);
  }

 private:
  Spec spec_;
  std::unique_ptr<KernelT> kernel_;
  OriginalWeights original_;
};

using Linear = PackedOp<LinearKernel>;
using Conv = PackedOp<ConvKernel>;

}  // namespace qpack
