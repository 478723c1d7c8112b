// Core concurrency test: many threads share one packed object; inputs with
// different scales force copy-on-write state rebuilds while others run; a
// thread releases, unpacks and finally closes. Every output must equal the
// single-threaded reference; after close every call reports CLOSED.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "qpack/qpack.h"

namespace {
constexpr int K = 45, N = 29, M = 3, kThreads = 8, kIters = 300;
std::atomic<int> g_failures{0};

void expect(bool ok, const char* what) {
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "FAIL: %s (%s)\n", what, qpack_last_error());
  }
}

void run_backend(qpack_backend backend) {
  std::vector<int8_t> w(N * K);
  std::vector<float> scales(N), bias(N);
  for (int i = 0; i < N * K; ++i) w[i] = static_cast<int8_t>((i * 37) % 255 - 127);
  for (int n = 0; n < N; ++n) {
    scales[n] = 0.002f + 0.0001f * n;
    bias[n] = 0.5f * n - 7.0f;
  }
  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = K;
  p.out_features = N;
  p.mode = QPACK_MODE_INT8_STATIC;
  p.backend = backend;
  p.weight = w.data();
  p.weight_scales = scales.data();
  p.num_weight_scales = N;
  p.bias = bias.data();
  p.output_scale = 0.2f;
  p.output_zero_point = 120;
  qpack_linear* lin = nullptr;
  expect(qpack_linear_create(&p, &lin) == QPACK_STATUS_SUCCESS, "create");

  const float in_scales[4] = {0.01f, 0.02f, 0.03f, 0.05f};
  std::vector<uint8_t> x(M * K);
  for (int i = 0; i < M * K; ++i) x[i] = static_cast<uint8_t>((i * 13) % 256);
  std::vector<std::vector<uint8_t>> ref(4, std::vector<uint8_t>(M * N));
  for (int s = 0; s < 4; ++s) {
    expect(qpack_linear_run_u8(lin, M, x.data(), in_scales[s], 128, ref[s].data()) ==
               QPACK_STATUS_SUCCESS, "reference run");
  }

  std::atomic<bool> closed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> y(M * N);
      for (int i = 0; i < kIters; ++i) {
        int s = (t + i) % 4;
        bool was_closed = closed.load();
        qpack_status st = qpack_linear_run_u8(lin, M, x.data(), in_scales[s], 128, y.data());
        if (st == QPACK_STATUS_SUCCESS) {
          expect(std::memcmp(y.data(), ref[s].data(), y.size()) == 0, "output equals reference");
        } else {
          expect(st == QPACK_STATUS_CLOSED, "only CLOSED may fail");
        }
        if (was_closed) expect(st == QPACK_STATUS_CLOSED, "run after close fails");
      }
    });
  }
  threads.emplace_back([&] {
    std::vector<int8_t> w2(N * K);
    expect(qpack_linear_release_original(lin) == QPACK_STATUS_SUCCESS, "release while running");
    for (int i = 0; i < 20; ++i) {
      expect(qpack_linear_unpack(lin, w2.data(), nullptr) == QPACK_STATUS_SUCCESS, "unpack");
      expect(std::memcmp(w2.data(), w.data(), w.size()) == 0, "unpack bit-exact while running");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    expect(qpack_linear_close(lin) == QPACK_STATUS_SUCCESS, "close while running");
    closed.store(true);
  });
  for (auto& th : threads) th.join();
  std::vector<uint8_t> y(M * N);
  expect(qpack_linear_run_u8(lin, M, x.data(), 0.01f, 128, y.data()) == QPACK_STATUS_CLOSED,
         "closed at the end");
  qpack_linear_destroy(lin);
}
// The same for a 3x3 conv (QNNPACK: copy-on-write bias state per input scale;
// oneDNN: runtime scales), NCHW in, NHWC out.
void run_conv_backend(qpack_backend backend) {
  constexpr int C = 6, OC = 10, H = 7, W = 5;
  std::vector<int8_t> w(OC * C * 9);
  std::vector<float> bias(OC);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int8_t>((i * 41) % 255 - 127);
  for (int n = 0; n < OC; ++n) bias[n] = 0.25f * n - 1.0f;
  float w_scale = 0.003f;
  qpack_conv2d_params p;
  qpack_conv2d_params_init(&p);
  p.in_channels = C;
  p.out_channels = OC;
  p.kernel_h = p.kernel_w = 3;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  p.mode = QPACK_MODE_INT8_STATIC;
  p.backend = backend;
  p.weight = w.data();
  p.weight_scales = &w_scale;
  p.num_weight_scales = 1;
  p.bias = bias.data();
  p.output_scale = 0.1f;
  p.output_zero_point = 100;
  qpack_conv2d* conv = nullptr;
  expect(qpack_conv2d_create(&p, &conv) == QPACK_STATUS_SUCCESS, "conv create");
  const float in_scales[3] = {0.02f, 0.04f, 0.07f};
  std::vector<uint8_t> x(C * H * W);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>((i * 29) % 256);
  std::vector<std::vector<uint8_t>> ref(3, std::vector<uint8_t>(OC * H * W));
  for (int s = 0; s < 3; ++s) {
    expect(qpack_conv2d_run_u8(conv, 1, H, W, QPACK_LAYOUT_NCHW, x.data(), in_scales[s], 128,
                               QPACK_LAYOUT_NHWC, ref[s].data()) == QPACK_STATUS_SUCCESS,
           "conv reference run");
  }
  std::atomic<bool> closed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> y(OC * H * W);
      for (int i = 0; i < kIters / 2; ++i) {
        int s = (t + i) % 3;
        bool was_closed = closed.load();
        qpack_status st = qpack_conv2d_run_u8(conv, 1, H, W, QPACK_LAYOUT_NCHW, x.data(),
                                              in_scales[s], 128, QPACK_LAYOUT_NHWC, y.data());
        if (st == QPACK_STATUS_SUCCESS) {
          expect(std::memcmp(y.data(), ref[s].data(), y.size()) == 0, "conv output equals reference");
        } else {
          expect(st == QPACK_STATUS_CLOSED, "conv: only CLOSED may fail");
        }
        if (was_closed) expect(st == QPACK_STATUS_CLOSED, "conv run after close fails");
      }
    });
  }
  threads.emplace_back([&] {
    std::vector<int8_t> w2(w.size());
    expect(qpack_conv2d_release_original(conv) == QPACK_STATUS_SUCCESS, "conv release");
    for (int i = 0; i < 10; ++i) {
      expect(qpack_conv2d_unpack(conv, w2.data(), nullptr) == QPACK_STATUS_SUCCESS, "conv unpack");
      expect(std::memcmp(w2.data(), w.data(), w.size()) == 0, "conv unpack bit-exact");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    expect(qpack_conv2d_close(conv) == QPACK_STATUS_SUCCESS, "conv close while running");
    closed.store(true);
  });
  for (auto& th : threads) th.join();
  qpack_conv2d_destroy(conv);
}
}  // namespace

int main() {
  qpack_set_num_threads(1);
  int ran = 0;
  for (qpack_backend b : {QPACK_BACKEND_QNNPACK, QPACK_BACKEND_ONEDNN}) {
    if (!qpack_backend_available(b)) {
      std::printf("skip backend %d: not in this build\n", static_cast<int>(b));
      continue;
    }
    run_backend(b);
    run_conv_backend(b);
    ran += 2;
  }
  int failures = g_failures.load();
  std::printf("concurrency: %d passed, %d failed\n", failures == 0 ? ran : 0, failures);
  return failures == 0 && ran > 0 ? 0 : 1;
}
