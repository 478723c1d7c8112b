// uint8 activation layouts around QNNPACK's NHWC kernels.
#pragma once

#include <cstdint>

#include "qpack/qpack.h"

namespace qpack {
namespace qnnpack_rt {

// [N, C, HW] -> [N, HW, C].
void nchw_to_nhwc_u8(const uint8_t* x, int64_t N, int64_t C, int64_t HW, uint8_t* out);

// Copies an NHWC image [N, SH, SW, C] (rows dy.., cols dx..) into
// [N, OH, OW, C] in `layout`: crops and changes layout in one pass.
void copy_nhwc_u8(const uint8_t* src, int64_t N, int64_t SH, int64_t SW, int64_t C, int64_t dy,
                  int64_t dx, int64_t OH, int64_t OW, qpack_layout layout, uint8_t* dst);

}  // namespace qnnpack_rt
}  // namespace qpack
