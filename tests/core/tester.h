// Builder-style testers of the core's ops through the C API of qpack.h, as
// XNNPACK's operator testers: set what matters, Test() builds the op, runs
// it against a plain C++ reference, checks unpack after release (bit-exact),
// the counters and close. A new op's tests are a tester plus a few lines.
//
//   LinearTester().batch(3).in_features(45).out_features(29)
//       .mode(QPACK_MODE_INT8_STATIC).backend(QPACK_BACKEND_QNNPACK).Test();
#pragma once

#include <cstdint>
#include <string>

#include "qpack/qpack.h"

namespace qpack_test {

// Failures so far (each printed to stderr with what failed).
int failures();
int checks();
// True when this build's backend has `op` (0 linear, 1 conv2d) in `mode`.
bool supports(qpack_backend backend, int op, qpack_mode mode);

// What every op tester shares: mode, backend, fused clamp, quantization.
template <typename Self>
class OpTester {
 public:
  Self& mode(qpack_mode m) { mode_ = m; return self(); }
  Self& backend(qpack_backend b) { backend_ = b; return self(); }
  Self& clamp(float lo, float hi) { clamp_min_ = lo; clamp_max_ = hi; return self(); }
  Self& per_channel(bool on) { per_channel_ = on; return self(); }
  Self& bias(bool on) { bias_ = on; return self(); }
  Self& seed(uint32_t s) { seed_ = s; return self(); }

 protected:
  Self& self() { return static_cast<Self&>(*this); }
  std::string describe_common() const;

  qpack_mode mode_ = QPACK_MODE_F32;
  qpack_backend backend_ = QPACK_BACKEND_AUTO;
  float clamp_min_ = -1.0f / 0.0f, clamp_max_ = 1.0f / 0.0f;
  bool per_channel_ = true, bias_ = true;
  uint32_t seed_ = 1;
};

class LinearTester : public OpTester<LinearTester> {
 public:
  LinearTester& batch(int64_t m) { M_ = m; return *this; }
  LinearTester& in_features(int64_t k) { K_ = k; return *this; }
  LinearTester& out_features(int64_t n) { N_ = n; return *this; }
  void Test() const;

 private:
  int64_t M_ = 1, K_ = 1, N_ = 1;
};

class ConvTester : public OpTester<ConvTester> {
 public:
  ConvTester& batch(int64_t n) { N_ = n; return *this; }
  ConvTester& input_size(int64_t h, int64_t w) { H_ = h; W_ = w; return *this; }
  ConvTester& channels(int64_t in, int64_t out) { IC_ = in; OC_ = out; return *this; }
  ConvTester& groups(int64_t g) { G_ = g; return *this; }
  ConvTester& kernel(int64_t kh, int64_t kw) { KH_ = kh; KW_ = kw; return *this; }
  ConvTester& stride(int64_t s) { S_ = s; return *this; }
  ConvTester& padding(int64_t p) { P_ = p; return *this; }
  ConvTester& dilation(int64_t d) { D_ = d; return *this; }
  ConvTester& layouts(qpack_layout x, qpack_layout y) { xl_ = x; yl_ = y; return *this; }
  void Test() const;

 private:
  int64_t N_ = 1, H_ = 7, W_ = 7, IC_ = 3, OC_ = 4, G_ = 1, KH_ = 3, KW_ = 3, S_ = 1, P_ = 0, D_ = 1;
  qpack_layout xl_ = QPACK_LAYOUT_NCHW, yl_ = QPACK_LAYOUT_NCHW;
};

}  // namespace qpack_test
