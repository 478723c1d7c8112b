#include "backends/qnnpack/nhwc.h"

#include <cstring>

namespace qpack {
namespace qnnpack_rt {

void nchw_to_nhwc_u8(const uint8_t* x, int64_t N, int64_t C, int64_t HW, uint8_t* out) {
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* src = x + n * C * HW;
    uint8_t* dst = out + n * C * HW;
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t p = 0; p < HW; ++p) dst[p * C + c] = src[c * HW + p];
    }
  }
}

void copy_nhwc_u8(const uint8_t* src, int64_t N, int64_t SH, int64_t SW, int64_t C, int64_t dy,
                  int64_t dx, int64_t OH, int64_t OW, qpack_layout layout, uint8_t* dst) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < OH; ++h) {
      const uint8_t* row = src + ((n * SH + h + dy) * SW + dx) * C;
      if (layout == QPACK_LAYOUT_NHWC) {
        std::memcpy(dst + (n * OH + h) * OW * C, row, static_cast<size_t>(OW * C));
        continue;
      }
      for (int64_t w = 0; w < OW; ++w) {
        for (int64_t c = 0; c < C; ++c) dst[((n * C + c) * OH + h) * OW + w] = row[w * C + c];
      }
    }
  }
}

}  // namespace qnnpack_rt
}  // namespace qpack
