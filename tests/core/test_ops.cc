// The core's ops on every backend and mode this build has, through the
// builder-style testers (tester.h).
#include <cstdio>
#include <initializer_list>

#include "core/tester.h"

using qpack_test::ConvTester;
using qpack_test::LinearTester;

namespace {
const qpack_backend kBackends[] = {QPACK_BACKEND_ONEDNN, QPACK_BACKEND_QNNPACK};
const qpack_mode kModes[] = {QPACK_MODE_F32, QPACK_MODE_INT8_STATIC, QPACK_MODE_INT8_DYNAMIC};
const float kInf = 1.0f / 0.0f;

void linear_grid(qpack_backend b, qpack_mode m) {
  for (int64_t batch : {0, 1, 5, 33}) {
    for (auto kn : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {37, 21}, {64, 64}, {130, 9}}) {
      LinearTester().backend(b).mode(m).batch(batch).in_features(kn.first).out_features(kn.second).Test();
    }
  }
  LinearTester().backend(b).mode(m).batch(4).in_features(40).out_features(24).clamp(0, kInf).Test();
  LinearTester().backend(b).mode(m).batch(4).in_features(40).out_features(24).clamp(-0.5f, 0.5f).Test();
  LinearTester().backend(b).mode(m).batch(3).in_features(45).out_features(29).per_channel(false).bias(false).Test();
}

void conv_grid(qpack_backend b, qpack_mode m) {
  for (auto l : {QPACK_LAYOUT_NCHW, QPACK_LAYOUT_NHWC}) {
    ConvTester().backend(b).mode(m).layouts(l, l).channels(3, 8).kernel(3, 3).padding(1).Test();
    ConvTester().backend(b).mode(m).layouts(l, l).channels(16, 24).kernel(1, 1).Test();
    ConvTester().backend(b).mode(m).layouts(l, l).channels(12, 12).groups(12).kernel(3, 3).padding(1).stride(2).Test();
    ConvTester().backend(b).mode(m).layouts(l, l).channels(10, 10).groups(10).kernel(5, 5).padding(2).Test();
    // 64 channels and more: oneDNN's int8 runs qpack's depthwise kernel (64- and 32-channel blocks)
    ConvTester().backend(b).mode(m).layouts(l, l).batch(2).input_size(9, 7).channels(112, 112).groups(112).kernel(3, 3).padding(1).clamp(0, 6).Test();
    ConvTester().backend(b).mode(m).layouts(l, l).input_size(11, 8).channels(72, 72).groups(72).kernel(5, 5).padding(2).stride(2).per_channel(false).Test();
    // 1x1 with blocks of 32-64 outputs: oneDNN's int8 runs qpack's pointwise kernel (6 inputs:
    // the last group reads past the pixel, the buffer's last pixel from a padded copy)
    ConvTester().backend(b).mode(m).layouts(l, l).batch(2).input_size(5, 7).channels(6, 40).kernel(1, 1).clamp(0, 6).Test();
    ConvTester().backend(b).mode(m).layouts(l, l).input_size(9, 9).channels(24, 100).kernel(1, 1).stride(2).per_channel(false).Test();
    ConvTester().backend(b).mode(m).layouts(l, l).channels(8, 12).groups(4).kernel(3, 3).dilation(2).padding(2).Test();
    ConvTester().backend(b).mode(m).layouts(l, l).batch(2).input_size(9, 6).channels(5, 7).kernel(2, 3).stride(2).clamp(0, 6).Test();
  }
  ConvTester().backend(b).mode(m).layouts(QPACK_LAYOUT_NCHW, QPACK_LAYOUT_NHWC).channels(4, 6).per_channel(false).bias(false).Test();
  ConvTester().backend(b).mode(m).batch(0).channels(4, 6).Test();
}
}  // namespace

int main() {
  int grids = 0;
  for (qpack_backend b : kBackends) {
    for (qpack_mode m : kModes) {
      if (qpack_test::supports(b, 0, m)) {
        linear_grid(b, m);
        ++grids;
      }
      if (qpack_test::supports(b, 1, m)) {
        conv_grid(b, m);
        ++grids;
      }
    }
  }
  std::printf("test_ops: %d grids, %d checks, %d failures\n", grids, qpack_test::checks(),
              qpack_test::failures());
  return qpack_test::failures() == 0 && grids > 0 ? 0 : 1;
}
