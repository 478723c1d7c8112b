// The QNNPACK operator struct that describes a convolution to
// PrePackConvWeights and qnnpackConv (qnnpack_func.h, PyTorch's entry points).
//
// Why qpack fills a private struct: QNNPACK's public API
// (pytorch_qnnp_create_convolution2d_nhwc_q8 in pytorch_qnnpack.h) packs the
// weights itself and keeps them, with per-run mutable state, inside the
// operator; it offers no way to describe a convolution over weights packed
// elsewhere. PyTorch's own prepack (qconv_prepack.cpp) therefore fills
// `struct pytorch_qnnp_operator` (QNNPACK's private src/qnnpack/operator.h) by
// hand, and qpack does the same. conv_operator.cc is the only file that
// includes operator.h; everything else sees an opaque pytorch_qnnp_operator_t.
#pragma once

#include <pytorch_qnnpack.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "core/conv.h"

namespace qpack {
namespace qnnpack_rt {

// QNNPACK's three packed convolution layouts (its ukernel types).
enum class ConvLayout {
  dwconv,  // depthwise 3x3 and 5x5
  gemm,    // 1x1, stride 1, no padding
  conv,    // everything else
};
ConvLayout conv_layout(const ConvSpec& spec);

struct OperatorDeleter {
  void operator()(pytorch_qnnp_operator_t op) const { pytorch_qnnp_delete_operator(op); }
};
using Operator = std::unique_ptr<std::remove_pointer_t<pytorch_qnnp_operator_t>, OperatorDeleter>;

// An operator describing spec as PyTorch's prepack builds it, with symmetric
// padding (pad_h, pad_w). With padding it carries a zero buffer filled with
// the input zero point, `zero_size` bytes past an offset of 8 when
// QNNPACK's kernels read ahead (fewer than 8 channels per group).
Operator make_conv_operator(const ConvSpec& spec, ConvLayout layout, uint8_t input_zero_point,
                            int64_t pad_h, int64_t pad_w, int64_t zero_size);

}  // namespace qnnpack_rt
}  // namespace qpack
