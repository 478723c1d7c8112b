// A backend's own graph operators (core/graph_op.h; QNNPACK's in
// backends/qnnpack/graph_ops.cc) against a float reference on a grid of
// shapes and parameters: every output byte within one quantum of the real
// result rounded half to even. Then many threads run one operator at once,
// each result equal to the single-threaded one. Runs on the host and under
// qemu on the aarch64 builds (make cross-test), so NEON's kernels are checked too.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "core/graph_op.h"
#include "core/quant.h"
#include "core/registry.h"

namespace {
using qpack::GraphOpDesc;
using qpack::QParams;
using qpack::Shape;

int g_checks = 0, g_failures = 0;

Shape shape4(int64_t n, int64_t c, int64_t h, int64_t w) {
  Shape s;
  s.rank = 4;
  s.d[0] = n;
  s.d[1] = c;
  s.d[2] = h;
  s.d[3] = w;
  return s;
}

std::vector<uint8_t> bytes(int64_t n, unsigned seed) {
  std::vector<uint8_t> v(static_cast<size_t>(n) + 64);  // QNNPACK reads a little past the end
  for (auto& b : v) b = static_cast<uint8_t>((seed = seed * 1103515245u + 12345u) >> 23);
  return v;
}

float deq(uint8_t v, QParams q) { return (static_cast<float>(v) - static_cast<float>(q.zero_point)) * q.scale; }

void expect_close(const char* what, const std::vector<uint8_t>& got, const std::vector<float>& real, QParams q,
                  uint8_t lo = 0, uint8_t hi = 255) {
  ++g_checks;
  for (size_t i = 0; i < real.size(); ++i) {
    const int want = std::min<int>(std::max<int>(qpack::quantize_u8(real[i], q.scale, q.zero_point), lo), hi);
    if (std::abs(int(got[i]) - want) > 1) {
      ++g_failures;
      std::fprintf(stderr, "FAIL %s: element %zu is %d, the reference %d\n", what, i, int(got[i]), want);
      return;
    }
  }
}

// Runs op (made by make for d) on x [N, C, H, W] NHWC (and x1 for add) into
// y; false when the backend has no such op or declines the parameters or shapes.
bool run(qpack::GraphOps::Make make, const GraphOpDesc& d, const Shape& xs, const Shape& ys,
         const uint8_t* x, const uint8_t* x1, std::vector<uint8_t>* y) {
  if (make == nullptr) return false;
  std::unique_ptr<qpack::GraphOp> op = make(d);
  if (op == nullptr || !op->accepts(xs, ys)) return false;
  y->assign(static_cast<size_t>(ys.numel()) + 64, 0);
  op->run(xs, ys, x, x1, y->data());
  return true;
}

// An elementwise node: act on [-1, 2.5] for a clamp, input x (and x1), output y.
GraphOpDesc elementwise_desc(qpack_node_kind kind, qpack_activation act, QParams x, QParams x1, QParams y) {
  GraphOpDesc d;
  d.kind = kind;
  d.act = act;
  d.act_min = -1.0f;
  d.act_max = 2.5f;
  d.x = x;
  d.x1 = x1;
  d.y = y;
  return d;
}

void elementwise(const qpack::GraphOps& g) {
  const QParams qa{0.05f, 120}, qb{0.03f, 7}, qy{0.07f, 100};
  for (int64_t n : {1, 7, 64, 1000, 4099}) {
    const Shape s = shape4(1, n, 1, 1);
    auto a = bytes(n, 1), b = bytes(n, 2);
    std::vector<uint8_t> y;
    for (qpack_activation act : {QPACK_ACT_NONE, QPACK_ACT_RELU, QPACK_ACT_CLAMP}) {
      const GraphOpDesc d = elementwise_desc(QPACK_NODE_ADD, act, qa, qb, qy);
      if (!run(g.add, d, s, s, a.data(), b.data(), &y)) continue;
      std::vector<float> real(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float r = deq(a[i], qa) + deq(b[i], qb);
        real[i] = act == QPACK_ACT_NONE ? r : act == QPACK_ACT_RELU ? std::max(r, 0.0f)
                                                                     : std::min(std::max(r, -1.0f), 2.5f);
      }
      expect_close("add", y, real, qy);
    }
    for (qpack_activation act : {QPACK_ACT_RELU, QPACK_ACT_CLAMP, QPACK_ACT_SIGMOID, QPACK_ACT_HARDSWISH}) {
      const QParams out = act == QPACK_ACT_SIGMOID ? QParams{1.0f / 256, 0} : act == QPACK_ACT_HARDSWISH ? qy : qa;
      const GraphOpDesc d = elementwise_desc(QPACK_NODE_ACTIVATION, act, qa, qa, out);
      const auto make = act == QPACK_ACT_SIGMOID ? g.sigmoid : act == QPACK_ACT_HARDSWISH ? g.hardswish : g.clamp;
      if (!run(make, d, s, s, a.data(), nullptr, &y)) continue;
      std::vector<float> real(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float v = deq(a[i], qa);
        real[i] = act == QPACK_ACT_RELU      ? std::max(v, 0.0f)
                  : act == QPACK_ACT_CLAMP   ? std::min(std::max(v, -1.0f), 2.5f)
                  : act == QPACK_ACT_SIGMOID ? 1.0f / (1.0f + std::exp(-v))
                                             : v * std::min(std::max(v + 3.0f, 0.0f), 6.0f) / 6.0f;
      }
      expect_close("activation", y, real, d.y);
    }
  }
}

// PyTorch's pooling (floor mode) on NHWC x: max, or the mean over the window
// counting padding (count_include_pad).
std::vector<float> pool_reference(bool max, const std::vector<uint8_t>& x, QParams q, const Shape& xs,
                                  const Shape& ys, int64_t k, int64_t s, int64_t p) {
  const int64_t N = xs.d[0], C = xs.d[1], H = xs.d[2], W = xs.d[3], OH = ys.d[2], OW = ys.d[3];
  std::vector<float> out(static_cast<size_t>(ys.numel()));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t oh = 0; oh < OH; ++oh) {
      for (int64_t ow = 0; ow < OW; ++ow) {
        for (int64_t c = 0; c < C; ++c) {
          float acc = max ? -std::numeric_limits<float>::infinity() : 0.0f;
          for (int64_t i = oh * s - p; i < oh * s - p + k; ++i) {
            for (int64_t j = ow * s - p; j < ow * s - p + k; ++j) {
              if (i < 0 || j < 0 || i >= H || j >= W) continue;
              const float v = deq(x[((n * H + i) * W + j) * C + c], q);
              acc = max ? std::max(acc, v) : acc + v;
            }
          }
          out[((n * OH + oh) * OW + ow) * C + c] = max ? acc : acc / static_cast<float>(k * k);
        }
      }
    }
  }
  return out;
}

void pooling(const qpack::GraphOps& g) {
  const QParams qx{0.04f, 30}, qy{0.03f, 60};
  for (int64_t C : {1, 3, 8, 17, 40}) {
    for (int64_t HW : {1, 2, 5, 9}) {
      for (int64_t N : {1, 2}) {
        const Shape xs = shape4(N, C, HW, HW);
        auto x = bytes(xs.numel(), static_cast<unsigned>(C * 31 + HW));
        std::vector<uint8_t> y;
        for (auto ksp : {std::vector<int64_t>{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {5, 3, 2}}) {
          const int64_t k = ksp[0], s = ksp[1], p = ksp[2];
          if (HW + 2 * p < k) continue;
          const int64_t o = (HW + 2 * p - k) / s + 1;
          const Shape ys = shape4(N, C, o, o);
          for (bool max : {true, false}) {
            GraphOpDesc d;
            d.kind = max ? QPACK_NODE_MAXPOOL2D : QPACK_NODE_AVGPOOL2D;
            d.kernel[0] = d.kernel[1] = k;
            d.stride[0] = d.stride[1] = s;
            std::fill(d.pad, d.pad + 4, p);
            d.x = qx;
            d.y = max ? qx : qy;
            if (!run(max ? g.max_pool : g.avg_pool, d, xs, ys, x.data(), nullptr, &y)) continue;
            expect_close(max ? "maxpool" : "avgpool", y, pool_reference(max, x, qx, xs, ys, k, s, p), d.y);
          }
        }
        GraphOpDesc d;
        d.kind = QPACK_NODE_GLOBAL_AVGPOOL;
        d.x = qx;
        d.y = qy;
        const Shape ys = shape4(N, C, 1, 1);
        if (run(g.global_avg_pool, d, xs, ys, x.data(), nullptr, &y)) {
          expect_close("global avgpool", y, pool_reference(false, x, qx, xs, ys, HW, 1, 0), qy);
        }
      }
    }
  }
}

// What the backend must decline (qpack's C++ code runs those).
void declines(const qpack::GraphOps& g) {
  auto expect_null = [](const char* what, qpack::GraphOps::Make make, const GraphOpDesc& d) {
    ++g_checks;
    if (make != nullptr && make(d) != nullptr) {
      ++g_failures;
      std::fprintf(stderr, "FAIL: the backend took %s\n", what);
    }
  };
  GraphOpDesc add;
  add.kind = QPACK_NODE_ADD;
  add.x = {1.0f, 0};
  add.x1 = {0.01f, 0};
  add.y = {0.001f, 0};  // ratio 1000
  expect_null("an add with scale ratio 1000", g.add, add);
  add.y = {0.01f, 0};
  add.act = QPACK_ACT_HARDSWISH;
  expect_null("an add with a fused hardswish", g.add, add);
  GraphOpDesc sig;
  sig.kind = QPACK_NODE_ACTIVATION;
  sig.act = QPACK_ACT_SIGMOID;
  sig.y = {0.01f, 0};
  expect_null("a sigmoid to scale 0.01", g.sigmoid, sig);
  GraphOpDesc relu = sig;
  relu.act = QPACK_ACT_RELU;
  relu.x = {0.02f, 3};
  expect_null("a requantizing relu", g.clamp, relu);
  GraphOpDesc avg;
  avg.kind = QPACK_NODE_AVGPOOL2D;
  avg.kernel[0] = avg.kernel[1] = 3;
  std::fill(avg.pad, avg.pad + 4, 1);
  avg.count_include_pad = false;
  expect_null("average pooling without the padding in the count", g.avg_pool, avg);
  avg.count_include_pad = true;
  avg.pad[2] = 0;
  expect_null("average pooling with asymmetric padding", g.avg_pool, avg);
  GraphOpDesc one = avg;
  one.kind = QPACK_NODE_MAXPOOL2D;
  one.kernel[0] = one.kernel[1] = 1;
  std::fill(one.pad, one.pad + 4, 0);
  expect_null("1x1 max pooling", g.max_pool, one);
}

void threads(const qpack::GraphOps& g) {
  if (g.avg_pool == nullptr) return;
  GraphOpDesc d;
  d.kind = QPACK_NODE_AVGPOOL2D;
  d.kernel[0] = d.kernel[1] = 3;
  std::fill(d.pad, d.pad + 4, 1);
  d.x = {0.04f, 30};
  d.y = {0.03f, 60};
  auto op = g.avg_pool(d);
  const Shape shapes[3][2] = {{shape4(1, 17, 9, 9), shape4(1, 17, 9, 9)},
                              {shape4(2, 40, 5, 7), shape4(2, 40, 5, 7)},
                              {shape4(3, 17, 4, 4), shape4(3, 17, 4, 4)}};
  std::vector<std::vector<uint8_t>> xs, refs;
  for (const auto& s : shapes) {
    xs.push_back(bytes(s[0].numel(), static_cast<unsigned>(s[0].d[1])));
    refs.emplace_back(static_cast<size_t>(s[1].numel()) + 64, 0);
    op->run(s[0], s[1], xs.back().data(), nullptr, refs.back().data());
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 12; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int k = (t + i) % 3;
        std::vector<uint8_t> y(refs[k].size(), 0);
        op->run(shapes[k][0], shapes[k][1], xs[k].data(), nullptr, y.data());
        if (y != refs[k]) ++bad;
      }
    });
  }
  for (auto& t : pool) t.join();
  ++g_checks;
  if (bad != 0) {
    ++g_failures;
    std::fprintf(stderr, "FAIL: %d concurrent runs differ from the single-threaded one\n", bad.load());
  }
}
}  // namespace

int main() {
  for (const auto& b : qpack::backends()) {
    if (!b.available()) continue;
    const qpack::GraphOps& g = b.ops.graph;
    const int checks = g_checks, failures = g_failures;
    elementwise(g);
    pooling(g);
    declines(g);
    threads(g);
    std::printf("graph_ops %s: %d checks, %d failures\n", b.name, g_checks - checks, g_failures - failures);
  }
  return g_failures == 0 ? 0 : 1;
}
