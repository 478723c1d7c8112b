#include "backends/qnnpack/conv_operator.h"

#include <qnnpack/operator.h>  // private: see conv_operator.h

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qpack {
namespace qnnpack_rt {

ConvLayout conv_layout(const ConvSpec& spec) {
  const bool dw_kernel = (spec.KH == 3 && spec.KW == 3) || (spec.KH == 5 && spec.KW == 5);
  if (dw_kernel && spec.depthwise() && spec.groups > 1) return ConvLayout::dwconv;
  if (spec.KH * spec.KW == 1 && spec.stride_h == 1 && spec.stride_w == 1 && !spec.padded()) {
    return ConvLayout::gemm;
  }
  return ConvLayout::conv;
}

Operator make_conv_operator(const ConvSpec& spec, ConvLayout layout, uint8_t input_zero_point,
                            int64_t pad_h, int64_t pad_w, int64_t zero_size) {
  auto* raw = static_cast<pytorch_qnnp_operator_t>(calloc(1, sizeof(pytorch_qnnp_operator)));
  check(raw != nullptr, QPACK_STATUS_OUT_OF_MEMORY, "could not allocate a QNNPACK operator");
  Operator op(raw);
  switch (layout) {
    case ConvLayout::dwconv: op->ukernel_type = pytorch_qnnp_ukernel_type_dwconv; break;
    case ConvLayout::gemm: op->ukernel_type = pytorch_qnnp_ukernel_type_gemm; break;
    case ConvLayout::conv: op->ukernel_type = pytorch_qnnp_ukernel_type_conv; break;
  }
  op->groups = static_cast<uint32_t>(spec.groups);
  op->group_input_channels = static_cast<size_t>(spec.icg());
  op->group_output_channels = static_cast<size_t>(spec.ocg());
  op->kernel_depth = 1;
  op->kernel_height = static_cast<uint32_t>(spec.KH);
  op->kernel_width = static_cast<uint32_t>(spec.KW);
  op->stride_depth = 1;
  op->stride_height = static_cast<uint32_t>(spec.stride_h);
  op->stride_width = static_cast<uint32_t>(spec.stride_w);
  op->dilation_depth = 1;
  op->dilation_height = static_cast<uint32_t>(spec.dil_h);
  op->dilation_width = static_cast<uint32_t>(spec.dil_w);
  op->input_padding_depth = 0;
  op->input_padding_height = static_cast<uint32_t>(pad_h);
  op->input_padding_width = static_cast<uint32_t>(pad_w);
  op->per_channel = spec.per_channel();
  op->transpose = false;
  if (pad_h != 0 || pad_w != 0) {
    const int64_t per_group = layout == ConvLayout::dwconv ? spec.groups : spec.icg();
    const size_t offset = per_group < 8 ? 8 : 0;
    const size_t size = static_cast<size_t>(zero_size) + offset;
    void* zero = std::malloc(size);
    check(zero != nullptr, QPACK_STATUS_OUT_OF_MEMORY, "could not allocate a zero buffer");
    std::memset(zero, input_zero_point, size);
    op->zero_buffer = zero;
    op->zero_pointer = static_cast<uint8_t*>(zero) + offset;
  }
  return op;
}

}  // namespace qnnpack_rt
}  // namespace qpack
