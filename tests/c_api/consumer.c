/* A plain-C consumer of qpack.h: what an Android/JNI embedder writes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qpack/qpack.h"

static int failures = 0;
static int passes = 0;
#define EXPECT(cond, ...)                                              \
  do {                                                                 \
    if (cond) {                                                        \
      ++passes;                                                        \
    } else {                                                           \
      ++failures;                                                      \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);             \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, " (last error: %s)\n", qpack_last_error());      \
    }                                                                  \
  } while (0)

enum { K = 37, N = 21, M = 5 };

/* Does any backend of this build run (op 0: linear, 1: conv2d) in mode? */
static int have_mode(int op, qpack_mode mode) {
  for (int i = 0; i < qpack_backend_count(); ++i) {
    qpack_backend_info b;
    if (qpack_backend_get_info(i, &b) != QPACK_STATUS_SUCCESS || !b.available) continue;
    if (((op == 0 ? b.linear_modes : b.conv2d_modes) >> mode) & 1u) return 1;
  }
  return 0;
}

static void test_build_info(void) {
  qpack_build_info bi;
  char line[256];
  EXPECT(qpack_get_build_info(&bi) == QPACK_STATUS_SUCCESS, "build info");
  EXPECT(strcmp(bi.version, qpack_version()) == 0, "build info version");
  EXPECT(bi.mobile == qpack_build_mobile(), "build info mobile flag");
  EXPECT(bi.with_onednn || bi.with_qnnpack, "at least one backend");
  EXPECT(bi.with_onednn == qpack_backend_available(QPACK_BACKEND_ONEDNN) || !bi.with_onednn,
         "oneDNN compiled but unavailable");
  EXPECT(strcmp(bi.threading, "openmp") == 0 || strcmp(bi.threading, "pthreadpool") == 0,
         "threading %s", bi.threading);
  if (bi.with_qnnpack) {
#if defined(__aarch64__)
    EXPECT(strcmp(bi.qnnpack_kernels, "aarch64-neon") == 0, "kernels %s", bi.qnnpack_kernels);
#elif defined(__x86_64__) || defined(__i386__)
    EXPECT(strcmp(bi.qnnpack_kernels, "sse2") == 0, "kernels %s", bi.qnnpack_kernels);
#endif
  } else {
    EXPECT(bi.qnnpack_kernels[0] == '\0', "no kernels without QNNPACK");
  }
  EXPECT(qpack_get_build_info(NULL) == QPACK_STATUS_INVALID_ARGUMENT, "build info NULL");
  EXPECT(qpack_build_info_string(line, sizeof(line)) == QPACK_STATUS_SUCCESS, "build info line");
  EXPECT(strstr(line, bi.target_arch) != NULL, "line names the arch");
  printf("%s\n", line);
  EXPECT(qpack_build_info_string(line, 8) == QPACK_STATUS_SUCCESS && strlen(line) == 7,
         "build info line truncated");
}

static void test_f32(void) {
  float w[N * K], b[N], x[M * K], y[M * N], w2[N * K], b2[N];
  for (int i = 0; i < N * K; ++i) w[i] = (float)((i * 7919) % 113) / 57.0f - 1.0f;
  for (int i = 0; i < N; ++i) b[i] = (float)i / 10.0f - 1.0f;
  for (int i = 0; i < M * K; ++i) x[i] = (float)((i * 104729) % 97) / 48.0f - 1.0f;

  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = K;
  p.out_features = N;
  p.weight = w;
  p.bias = b;
  p.retain = QPACK_RETAIN_RELEASE;
  p.clamp_min = 0.0f; /* fused relu */
  qpack_linear* lin = NULL;
  EXPECT(qpack_linear_create(&p, &lin) == QPACK_STATUS_SUCCESS && lin != NULL, "create f32");
  EXPECT(qpack_linear_run_f32(lin, M, x, y) == QPACK_STATUS_SUCCESS, "run f32");
  double max_err = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double acc = b[n];
      for (int k = 0; k < K; ++k) acc += (double)x[m * K + k] * w[n * K + k];
      if (acc < 0) acc = 0;
      double err = fabs(acc - y[m * N + n]);
      if (err > max_err) max_err = err;
    }
  }
  EXPECT(max_err < 1e-4, "f32 max error %g", max_err);

  qpack_linear_info info;
  EXPECT(qpack_linear_get_info(lin, &info) == QPACK_STATUS_SUCCESS, "info");
  EXPECT(info.has_original == 0 && info.nbytes_original == 0, "released at create");
  EXPECT(info.nbytes_packed >= sizeof(w), "packed bytes %zu", info.nbytes_packed);
  EXPECT(qpack_linear_unpack(lin, w2, b2) == QPACK_STATUS_SUCCESS, "unpack");
  EXPECT(memcmp(w, w2, sizeof(w)) == 0 && memcmp(b, b2, sizeof(b)) == 0, "unpack bit-exact");

  /* Errors: status + message, object still usable. */
  EXPECT(qpack_linear_run_u8(lin, M, (const uint8_t*)x, 0.1f, 0, (uint8_t*)y) ==
             QPACK_STATUS_INVALID_TYPE, "u8 run on f32 layer");
  EXPECT(strstr(qpack_last_error(), "float32") != NULL, "message names the dtype");
  EXPECT(qpack_linear_run_f32(lin, -1, x, y) == QPACK_STATUS_INVALID_ARGUMENT, "negative batch");
  EXPECT(qpack_linear_run_f32(lin, M, x, y) == QPACK_STATUS_SUCCESS, "usable after errors");

  EXPECT(qpack_linear_close(lin) == QPACK_STATUS_SUCCESS, "close");
  EXPECT(qpack_linear_close(lin) == QPACK_STATUS_SUCCESS, "close twice");
  EXPECT(qpack_linear_run_f32(lin, M, x, y) == QPACK_STATUS_CLOSED, "run after close");
  EXPECT(qpack_linear_unpack(lin, w2, b2) == QPACK_STATUS_CLOSED, "unpack after close");
  qpack_linear_destroy(lin);
  qpack_linear_destroy(NULL);
}

/* A static int8 linear (u8 in and out, output zero point 128), backend AUTO. */
static qpack_linear_params int8_static_params(int64_t k, int64_t n, const int8_t* w,
                                              const float* scales, int64_t num_scales,
                                              float output_scale) {
  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = k;
  p.out_features = n;
  p.mode = QPACK_MODE_INT8_STATIC;
  p.weight = w;
  p.weight_scales = scales;
  p.num_weight_scales = num_scales;
  p.output_scale = output_scale;
  p.output_zero_point = 128;
  return p;
}

static void test_int8_backends_agree(void) {
  int8_t w[N * K], w2[N * K];
  uint8_t x[M * K], y1[M * N], y2[M * N];
  float scales[N], b[N];
  for (int i = 0; i < N * K; ++i) w[i] = (int8_t)((i * 31) % 255 - 127);
  for (int i = 0; i < N; ++i) {
    scales[i] = 0.001f * (float)(i + 1);
    b[i] = (float)i - 10.0f;
  }
  for (int i = 0; i < M * K; ++i) x[i] = (uint8_t)((i * 17) % 256);

  qpack_linear* lin[2] = {NULL, NULL};
  qpack_backend backends[2] = {QPACK_BACKEND_QNNPACK, QPACK_BACKEND_ONEDNN};
  int nb = 0;
  for (int i = 0; i < 2; ++i) {
    if (!qpack_backend_available(backends[i])) {
      printf("skip int8 linear on backend %d: not in this build\n", (int)backends[i]);
      continue;
    }
    backends[nb++] = backends[i];
  }
  for (int i = 0; i < nb; ++i) {
    qpack_linear_params p = int8_static_params(K, N, w, scales, N, 0.25f);
    p.backend = backends[i];
    p.bias = b;
    EXPECT(qpack_linear_create(&p, &lin[i]) == QPACK_STATUS_SUCCESS, "create int8 backend %d", i);
  }
  if (nb == 2) {
    EXPECT(qpack_linear_run_u8(lin[0], M, x, 0.02f, 100, y1) == QPACK_STATUS_SUCCESS, "run qnnpack");
    EXPECT(qpack_linear_run_u8(lin[1], M, x, 0.02f, 100, y2) == QPACK_STATUS_SUCCESS, "run onednn");
    int max_diff = 0;
    for (int i = 0; i < M * N; ++i) {
      int d = abs((int)y1[i] - (int)y2[i]);
      if (d > max_diff) max_diff = d;
    }
    EXPECT(max_diff <= 1, "backends differ by %d quanta", max_diff);
  } else if (nb == 1) {
    /* One backend: the same input twice gives the same output, before and
     * after the original is released. */
    EXPECT(qpack_linear_run_u8(lin[0], M, x, 0.02f, 100, y1) == QPACK_STATUS_SUCCESS, "run int8");
    EXPECT(qpack_linear_release_original(lin[0]) == QPACK_STATUS_SUCCESS, "release");
    EXPECT(qpack_linear_run_u8(lin[0], M, x, 0.02f, 100, y2) == QPACK_STATUS_SUCCESS, "run int8");
    EXPECT(memcmp(y1, y2, sizeof(y1)) == 0, "int8 output unchanged by release");
  }
  for (int i = 0; i < nb; ++i) {
    EXPECT(qpack_linear_release_original(lin[i]) == QPACK_STATUS_SUCCESS, "release");
    EXPECT(qpack_linear_unpack(lin[i], w2, NULL) == QPACK_STATUS_SUCCESS, "unpack int8");
    EXPECT(memcmp(w, w2, sizeof(w)) == 0, "int8 unpack bit-exact on backend %d", i);
    EXPECT(qpack_linear_run_u8(lin[i], M, x, 0.0f, 0, y1) == QPACK_STATUS_INVALID_ARGUMENT,
           "zero input scale rejected");
    EXPECT(qpack_linear_run_u8(lin[i], M, x, 0.02f, 256, y1) == QPACK_STATUS_INVALID_ARGUMENT,
           "zero point out of range rejected");
    qpack_linear_destroy(lin[i]);
  }
}

static void test_bad_params(void) {
  float w[4] = {1, 2, 3, 4};
  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = 2;
  p.out_features = 2;
  p.weight = w;
  qpack_linear* lin = NULL;
  EXPECT(qpack_linear_create(NULL, &lin) == QPACK_STATUS_INVALID_ARGUMENT, "NULL params");
  p.in_features = 0;
  EXPECT(qpack_linear_create(&p, &lin) == QPACK_STATUS_INVALID_ARGUMENT && lin == NULL, "K = 0");
  p.in_features = 2;
  p.backend = QPACK_BACKEND_QNNPACK;
  EXPECT(qpack_linear_create(&p, &lin) == QPACK_STATUS_UNSUPPORTED, "f32 on QNNPACK");
  p.backend = QPACK_BACKEND_AUTO;
  p.mode = QPACK_MODE_INT8_DYNAMIC;
  EXPECT(qpack_linear_create(&p, &lin) == QPACK_STATUS_INVALID_ARGUMENT, "int8 without scales");
  EXPECT(strstr(qpack_last_error(), "weight_scale") != NULL, "message names weight_scale");
  EXPECT(qpack_set_num_threads(0) == QPACK_STATUS_INVALID_ARGUMENT, "0 threads");
}

static void test_retain_policy(void) {
  int saved = qpack_get_default_retain();
  qpack_set_default_retain(0);
  EXPECT(qpack_resolve_retain(QPACK_RETAIN_DEFAULT) == 0, "process default");
  int prev = qpack_set_thread_retain(QPACK_RETAIN_KEEP);
  EXPECT(prev == QPACK_RETAIN_DEFAULT, "no override before");
  EXPECT(qpack_resolve_retain(QPACK_RETAIN_DEFAULT) == 1, "thread override wins");
  EXPECT(qpack_resolve_retain(QPACK_RETAIN_RELEASE) == 0, "per-object wins");
  qpack_set_thread_retain(QPACK_RETAIN_DEFAULT);
  qpack_set_default_retain(saved);
  EXPECT(qpack_build_mobile() == (saved ? 0 : 1), "mobile build releases by default");
}

/* The same int8 linear with 1 and 2 threads inside the run (OpenMP, or
 * pthreadpool when built with QPACK_OPENMP=OFF): equal outputs. */
static void test_threads(void) {
  enum { TM = 64, TK = 256, TN = 96 };
  static int8_t w[TN * TK];
  static uint8_t x[TM * TK], y1[TM * TN], y2[TM * TN];
  float scale = 0.002f;
  for (int i = 0; i < TN * TK; ++i) w[i] = (int8_t)((i * 53) % 255 - 127);
  for (int i = 0; i < TM * TK; ++i) x[i] = (uint8_t)((i * 7) % 256);
  qpack_linear_params p = int8_static_params(TK, TN, w, &scale, 1, 0.3f);
  qpack_linear* lin = NULL;
  EXPECT(qpack_linear_create(&p, &lin) == QPACK_STATUS_SUCCESS, "create int8 (threads)");
  const int saved = qpack_get_num_threads();
  qpack_set_num_threads(1);
  EXPECT(qpack_linear_run_u8(lin, TM, x, 0.05f, 128, y1) == QPACK_STATUS_SUCCESS, "run 1 thread");
  EXPECT(qpack_set_num_threads(2) == QPACK_STATUS_SUCCESS && qpack_get_num_threads() == 2,
         "2 threads");
  EXPECT(qpack_linear_run_u8(lin, TM, x, 0.05f, 128, y2) == QPACK_STATUS_SUCCESS, "run 2 threads");
  EXPECT(memcmp(y1, y2, sizeof(y1)) == 0, "1 and 2 threads agree");
  qpack_set_num_threads(saved);
  qpack_linear_destroy(lin);
}

/* A frozen graph from C: f32 [M, K] -> quantize -> static int8 linear -> ReLU
 * (u8) -> dequantize, against the same ops through the single-op API. Scales
 * are powers of two, so the graph's quantize (x * 1/s) and this file's (x / s)
 * round the same values. */
static void test_graph(void) {
  int8_t w[N * K];
  float scales[N], x[M * K], out[M * N];
  uint8_t xq[M * K], yq[M * N];
  for (int i = 0; i < N * K; ++i) w[i] = (int8_t)((i * 29) % 255 - 127);
  for (int i = 0; i < N; ++i) scales[i] = 0.001f + 0.0001f * i;
  for (int i = 0; i < M * K; ++i) x[i] = (float)((i * 7) % 41) / 8.0f - 2.5f;
  const float s_in = 0.0625f, s_out = 0.125f;
  qpack_linear_params p = int8_static_params(K, N, w, scales, N, s_out);
  qpack_linear* lin = NULL;
  EXPECT(qpack_linear_create(&p, &lin) == QPACK_STATUS_SUCCESS, "graph: linear");

  qpack_graph_value values[5] = {{QPACK_DTYPE_F32, 0, 0}, {QPACK_DTYPE_U8, s_in, 128},
                                 {QPACK_DTYPE_U8, s_out, 128}, {QPACK_DTYPE_U8, s_out, 128},
                                 {QPACK_DTYPE_F32, 0, 0}};
  qpack_graph_node nodes[4];
  memset(nodes, 0, sizeof(nodes));
  const qpack_node_kind kinds[4] = {QPACK_NODE_QUANTIZE, QPACK_NODE_LINEAR, QPACK_NODE_ACTIVATION,
                                    QPACK_NODE_DEQUANTIZE};
  for (int i = 0; i < 4; ++i) {
    nodes[i].kind = kinds[i];
    nodes[i].inputs[0] = i;
    nodes[i].num_inputs = 1;
    nodes[i].output = i + 1;
  }
  nodes[1].linear = lin;
  nodes[2].activation = QPACK_ACT_RELU;
  int32_t in_v = 0, out_v = 4;
  qpack_graph_params gp = {5, values, 4, nodes, 1, &in_v, 1, &out_v};
  qpack_graph* g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && g != NULL, "graph: create");
  /* the graph holds the linear by reference: its handle can go */
  qpack_linear_close(lin);
  qpack_linear_destroy(lin);

  qpack_tensor ti = {QPACK_DTYPE_F32, 2, {M, K, 0, 0}, QPACK_LAYOUT_NCHW, x};
  qpack_tensor to;
  memset(&to, 0, sizeof(to));
  EXPECT(qpack_graph_output_shapes(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS && to.ndim == 2 &&
             to.dims[0] == M && to.dims[1] == N && to.dtype == QPACK_DTYPE_F32,
         "graph: output shapes");
  to.data = out;
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "graph: run");

  /* The reference: the same ops one by one (the linear reopened from the same weights). */
  for (int i = 0; i < M * K; ++i) {
    float q = nearbyintf(x[i] / s_in) + 128.0f;
    xq[i] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
  }
  EXPECT(qpack_linear_create(&p, &lin) == QPACK_STATUS_SUCCESS, "graph: reference linear");
  EXPECT(qpack_linear_run_u8(lin, M, xq, s_in, 128, yq) == QPACK_STATUS_SUCCESS, "graph: reference run");
  int same = 1;
  for (int i = 0; i < M * N; ++i) {
    const uint8_t r = yq[i] < 128 ? 128 : yq[i];
    same &= out[i] == (float)(r - 128) * s_out;
  }
  EXPECT(same, "graph: equal to the ops one by one");
  qpack_linear_destroy(lin);

  qpack_graph_info info;
  EXPECT(qpack_graph_get_info(g, &info) == QPACK_STATUS_SUCCESS && info.num_nodes == 4 &&
             info.runs == 1 && info.plans_built == 1 && info.nbytes_packed > 0 && !info.closed,
         "graph: info");
  EXPECT(qpack_graph_close(g) == QPACK_STATUS_SUCCESS, "graph: close");
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_CLOSED, "graph: run after close");
  EXPECT(qpack_graph_get_info(g, &info) == QPACK_STATUS_SUCCESS && info.closed, "graph: closed");
  qpack_graph_destroy(g);
  qpack_graph_destroy(NULL);

  /* a node reading a value nothing produced */
  nodes[1].linear = NULL;
  nodes[0].inputs[0] = 3;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL,
         "graph: refuses a value read before it is produced");
}

/* A residual add run inside its convolution (f32, oneDNN's sum post-op):
 * r = relu(x), h = clamp(x, -1, 1), c = conv1x1(h), y = relu(c + r),
 * out = clamp(y, 0, 1). The add's node names the convolution, the caller's
 * input is untouched, and the values are the ops' one by one within float
 * rounding. */
static void test_graph_fused_add(void) {
  enum { C = 16, H = 3, W = 5, P = H * W };
  float w[C * C], x[C * P], x0[C * P], out[C * P];
  for (int i = 0; i < C * C; ++i) w[i] = (float)((i * 37) % 19 - 9) / 16.0f;
  for (int i = 0; i < C * P; ++i) x0[i] = x[i] = (float)((i * 13) % 23 - 11) / 8.0f;
  qpack_conv2d_params cp;
  qpack_conv2d_params_init(&cp);
  cp.in_channels = cp.out_channels = C;
  cp.kernel_h = cp.kernel_w = 1;
  cp.mode = QPACK_MODE_F32;
  cp.weight = w;
  qpack_conv2d* conv = NULL;
  EXPECT(qpack_conv2d_create(&cp, &conv) == QPACK_STATUS_SUCCESS, "fused add: conv");
  qpack_graph_value values[6];
  for (int i = 0; i < 6; ++i) values[i] = (qpack_graph_value){QPACK_DTYPE_F32, 0, 0};
  qpack_graph_node nodes[5];
  memset(nodes, 0, sizeof(nodes));
  nodes[0] = (qpack_graph_node){.kind = QPACK_NODE_ACTIVATION, .inputs = {0}, .num_inputs = 1, .output = 1,
                                .activation = QPACK_ACT_RELU};
  nodes[1] = (qpack_graph_node){.kind = QPACK_NODE_ACTIVATION, .inputs = {0}, .num_inputs = 1, .output = 2,
                                .activation = QPACK_ACT_CLAMP, .act_min = -1.0f, .act_max = 1.0f};
  nodes[2] = (qpack_graph_node){.kind = QPACK_NODE_CONV2D, .inputs = {2}, .num_inputs = 1, .output = 3, .conv = conv};
  nodes[3] = (qpack_graph_node){.kind = QPACK_NODE_ADD, .inputs = {3, 1}, .num_inputs = 2, .output = 4,
                                .activation = QPACK_ACT_RELU};
  nodes[4] = (qpack_graph_node){.kind = QPACK_NODE_ACTIVATION, .inputs = {4}, .num_inputs = 1, .output = 5,
                                .activation = QPACK_ACT_CLAMP, .act_min = 0.0f, .act_max = 1.0f};
  int32_t in_v = 0, out_v = 5;
  qpack_graph_params gp = {6, values, 5, nodes, 1, &in_v, 1, &out_v};
  qpack_graph* g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && g != NULL, "fused add: create");
  char held[32];
  EXPECT(qpack_graph_value_layout(g, 3, held, sizeof(held)) == QPACK_STATUS_SUCCESS &&
             strcmp(held, "unplanned") == 0,
         "value layout before a plan (%s)", held);
  qpack_tensor ti = {QPACK_DTYPE_F32, 4, {1, C, H, W}, QPACK_LAYOUT_NCHW, x};
  qpack_tensor to = {QPACK_DTYPE_F32, 4, {1, C, H, W}, QPACK_LAYOUT_NCHW, out};
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "fused add: run");
  EXPECT(qpack_graph_value_layout(g, 3, held, sizeof(held)) == QPACK_STATUS_SUCCESS && strcmp(held, "NHWC") == 0,
         "the convolution's output is held NHWC (%s)", held);
  EXPECT(qpack_graph_value_layout(g, 6, held, sizeof(held)) == QPACK_STATUS_INVALID_ARGUMENT &&
             qpack_graph_value_layout(g, -1, held, sizeof(held)) == QPACK_STATUS_INVALID_ARGUMENT &&
             qpack_graph_value_layout(g, 0, NULL, 8) == QPACK_STATUS_INVALID_ARGUMENT,
         "value layout: bad index or buffer");
  char where[128];
  EXPECT(qpack_graph_node_backend(g, 3, where, sizeof(where)) == QPACK_STATUS_SUCCESS &&
             strcmp(where, "onednn (sum post-op of node 2)") == 0,
         "fused add: the add runs in node 2 (%s)", where);
  double worst = 0.0;
  for (int o = 0; o < C; ++o) {
    for (int q = 0; q < P; ++q) {
      double c = 0.0;
      for (int i = 0; i < C; ++i) {
        const double h = x0[i * P + q] < -1 ? -1 : x0[i * P + q] > 1 ? 1 : x0[i * P + q];
        c += (double)w[o * C + i] * h;
      }
      double y = c + (x0[o * P + q] > 0 ? x0[o * P + q] : 0.0);
      y = y < 0 ? 0 : y > 1 ? 1 : y;
      const double d = fabs(y - (double)out[o * P + q]);
      worst = d > worst ? d : worst;
    }
  }
  EXPECT(worst < 1e-5, "fused add: values (worst difference %g)", worst);
  EXPECT(memcmp(x, x0, sizeof(x)) == 0, "fused add: the caller's input is untouched");
  qpack_graph_destroy(g);
  qpack_conv2d_destroy(conv);
}

/* PReLU (two slopes) then a nearest x2 resize, f32 [1, 2, 1, 2] NCHW: exact values;
 * slopes of the wrong count and a resize to size 0 are refused with a message. */
static void test_graph_prelu_resize(void) {
  const float slopes[2] = {0.5f, -2.0f};
  qpack_graph_value values[3] = {{QPACK_DTYPE_F32, 0, 0}, {QPACK_DTYPE_F32, 0, 0}, {QPACK_DTYPE_F32, 0, 0}};
  qpack_graph_node nodes[2];
  memset(nodes, 0, sizeof(nodes));
  nodes[0].kind = QPACK_NODE_PRELU;
  nodes[0].num_inputs = 1;
  nodes[0].output = 1;
  nodes[0].affine_scale = slopes;
  nodes[0].channels = 2;
  nodes[1].kind = QPACK_NODE_RESIZE_NEAREST;
  nodes[1].inputs[0] = 1;
  nodes[1].num_inputs = 1;
  nodes[1].output = 2;
  nodes[1].act_min = nodes[1].act_max = 2.0f; /* scale factors */
  int32_t in_v = 0, out_v = 2;
  qpack_graph_params gp = {3, values, 2, nodes, 1, &in_v, 1, &out_v};
  qpack_graph* g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && g != NULL, "prelu/resize: create");
  float x[4] = {-1.0f, 3.0f, -4.0f, 5.0f}, y[16];
  qpack_tensor ti = {QPACK_DTYPE_F32, 4, {1, 2, 1, 2}, QPACK_LAYOUT_NCHW, x};
  qpack_tensor to = {QPACK_DTYPE_F32, 4, {1, 2, 2, 4}, QPACK_LAYOUT_NCHW, y};
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "prelu/resize: run");
  const float want[16] = {-0.5f, -0.5f, 3, 3, -0.5f, -0.5f, 3, 3, 8, 8, 5, 5, 8, 8, 5, 5};
  EXPECT(memcmp(y, want, sizeof(want)) == 0, "prelu/resize: values");
  qpack_graph_destroy(g);

  nodes[0].channels = 0;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL &&
             strstr(qpack_last_error(), "prelu") != NULL,
         "prelu: refuses 0 slopes");
  nodes[0].channels = 2;
  nodes[1].act_min = nodes[1].act_max = 0.0f; /* neither a size nor scale factors */
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL &&
             strstr(qpack_last_error(), "output size") != NULL,
         "resize: refuses size 0");
}

/* qpack_attention_f32 against plain loops in double, causal or not, one head's
 * rows strided (two heads interleaved row by row), and its argument errors. */
static void test_attention(void) {
  enum { B = 2, H = 2, L = 5, S = 7, D = 20 };
  static float q[B][L][H][D], k[B][S][H][D], v[B][S][H][D], out[B][H][L][D];
  unsigned seed = 7;
  float* all[3] = {&q[0][0][0][0], &k[0][0][0][0], &v[0][0][0][0]};
  int sizes[3] = {B * L * H * D, B * S * H * D, B * S * H * D};
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < sizes[t]; ++i) {
      seed = seed * 1103515245u + 12345u;
      all[t][i] = (float)((seed >> 9) % 2001) / 1000.0f - 1.0f;
    }
  }
  const int64_t qs[3] = {L * H * D, D, H * D}, ks[3] = {S * H * D, D, H * D}, os[3] = {H * L * D, L * D, D};
  for (int causal = 0; causal <= 1; ++causal) {
    EXPECT(qpack_attention_f32(&q[0][0][0][0], qs, &k[0][0][0][0], ks, &v[0][0][0][0], ks, &out[0][0][0][0], os,
                               B, H, L, S, D, 0.25f, causal) == QPACK_STATUS_SUCCESS, "attention runs");
    double worst = 0;
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        for (int i = 0; i < L; ++i) {
          double p[S], mx = -1e300, sum = 0;
          const int n = causal ? (i + 1 < S ? i + 1 : S) : S;
          for (int j = 0; j < n; ++j) {
            double sc = 0;
            for (int d = 0; d < D; ++d) sc += (double)q[b][i][h][d] * k[b][j][h][d];
            p[j] = 0.25 * sc;
            if (p[j] > mx) mx = p[j];
          }
          for (int j = 0; j < n; ++j) sum += (p[j] = exp(p[j] - mx));
          for (int d = 0; d < D; ++d) {
            double o = 0;
            for (int j = 0; j < n; ++j) o += p[j] / sum * v[b][j][h][d];
            const double e = fabs(o - out[b][h][i][d]);
            if (e > worst) worst = e;
          }
        }
      }
    }
    EXPECT(worst < 1e-5, "attention (causal %d) within 1e-5 of double, worst %g", causal, worst);
  }
  EXPECT(qpack_attention_f32(&q[0][0][0][0], NULL, &k[0][0][0][0], ks, &v[0][0][0][0], ks, &out[0][0][0][0], os, B,
                             H, L, S, D, 1.0f, 0) == QPACK_STATUS_INVALID_ARGUMENT, "NULL strides");
  EXPECT(qpack_attention_f32(&q[0][0][0][0], qs, &k[0][0][0][0], ks, &v[0][0][0][0], ks, &out[0][0][0][0], os, B,
                             H, L, 0, D, 1.0f, 0) == QPACK_STATUS_INVALID_ARGUMENT, "no keys");
  EXPECT(strstr(qpack_last_error(), "no keys") != NULL, "message says no keys");
  EXPECT(qpack_attention_f32(&q[0][0][0][0], qs, &k[0][0][0][0], ks, &v[0][0][0][0], ks, &out[0][0][0][0], os, B,
                             H, L, S, 0, 1.0f, 0) == QPACK_STATUS_INVALID_ARGUMENT, "D = 0");
}

/* qpack_attention_f32_mask: a mask shared by the batch (batch stride 0) added to
 * the scores, v's rows of Dv != D floats, against double loops; a row the mask
 * hides entirely gives 0 (not NaN); a mask without strides and Dv = 0 refused. */
static void test_attention_mask(void) {
  enum { B = 2, H = 2, L = 4, S = 6, D = 8, Dv = 5 };
  static float q[B][H][L][D], k[B][H][S][D], v[B][H][S][Dv], mask[H][L][S], out[B][H][L][Dv];
  unsigned seed = 11;
  float* all[4] = {&q[0][0][0][0], &k[0][0][0][0], &v[0][0][0][0], &mask[0][0][0]};
  int sizes[4] = {B * H * L * D, B * H * S * D, B * H * S * Dv, H * L * S};
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < sizes[t]; ++i) {
      seed = seed * 1103515245u + 12345u;
      all[t][i] = (float)((seed >> 9) % 2001) / 1000.0f - 1.0f;
    }
  }
  for (int j = 0; j < S; ++j) mask[1][2][j] = -INFINITY;  /* head 1, query 2: no key */
  const int64_t qs[3] = {H * L * D, L * D, D}, ks[3] = {H * S * D, S * D, D}, vs[3] = {H * S * Dv, S * Dv, Dv};
  const int64_t ms[3] = {0, L * S, S}, os[3] = {H * L * Dv, L * Dv, Dv};
  EXPECT(qpack_attention_f32_mask(&q[0][0][0][0], qs, &k[0][0][0][0], ks, &v[0][0][0][0], vs, &mask[0][0][0], ms,
                                  &out[0][0][0][0], os, B, H, L, S, D, Dv, 0.5f, 0) == QPACK_STATUS_SUCCESS,
         "masked attention runs");
  double worst = 0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < L; ++i) {
        const int hidden = h == 1 && i == 2;
        double p[S], mx = -1e300, sum = 0;
        for (int j = 0; j < S; ++j) {
          double sc = 0;
          for (int d = 0; d < D; ++d) sc += (double)q[b][h][i][d] * k[b][h][j][d];
          p[j] = 0.5 * sc + (hidden ? 0.0 : mask[h][i][j]);
          if (p[j] > mx) mx = p[j];
        }
        for (int j = 0; j < S; ++j) sum += (p[j] = exp(p[j] - mx));
        for (int d = 0; d < Dv; ++d) {
          double o = 0;
          for (int j = 0; j < S; ++j) o += hidden ? 0.0 : p[j] / sum * v[b][h][j][d];
          const double e = isnan(out[b][h][i][d]) ? 1e300 : fabs(o - out[b][h][i][d]);
          if (e > worst) worst = e;
        }
      }
    }
  }
  EXPECT(worst < 1e-5, "masked attention within 1e-5 of double (a hidden row 0), worst %g", worst);
  EXPECT(qpack_attention_f32_mask(&q[0][0][0][0], qs, &k[0][0][0][0], ks, &v[0][0][0][0], vs, &mask[0][0][0], NULL,
                                  &out[0][0][0][0], os, B, H, L, S, D, Dv, 0.5f, 0) == QPACK_STATUS_INVALID_ARGUMENT,
         "a mask without strides");
  EXPECT(qpack_attention_f32_mask(&q[0][0][0][0], qs, &k[0][0][0][0], ks, &v[0][0][0][0], vs, NULL, NULL,
                                  &out[0][0][0][0], os, B, H, L, S, D, 0, 0.5f, 0) == QPACK_STATUS_INVALID_ARGUMENT,
         "Dv = 0");
  EXPECT(strstr(qpack_last_error(), "Dv") != NULL, "message names Dv");
}

/* The attention graph node over a packed qkv value [N, L, 3 H D] (q, k, v read where
 * they are: offsets 0, H D, 2 H D) equals qpack_attention_f32 over the same strided
 * heads; a value too narrow for the heads is refused at run, the graph stays usable. */
static void test_graph_attention(void) {
  enum { N = 2, L = 5, H = 3, D = 4, C = 3 * H * D };
  static float x[N][L][C], y[N][L][H * D], want[N][L][H * D];
  unsigned seed = 5;
  for (int i = 0; i < N * L * C; ++i) {
    seed = seed * 1103515245u + 12345u;
    (&x[0][0][0])[i] = (float)((seed >> 9) % 2001) / 1000.0f - 1.0f;
  }
  qpack_graph_value values[2] = {{QPACK_DTYPE_F32, 0, 0}, {QPACK_DTYPE_F32, 0, 0}};
  qpack_graph_node node;
  memset(&node, 0, sizeof(node));
  node.kind = QPACK_NODE_ATTENTION;
  node.num_inputs = 3; /* inputs 0, 0, 0: one value for q, k and v */
  node.output = 1;
  node.kernel_h = H;
  node.kernel_w = D;
  node.stride_h = D;
  node.pad_left = H * D;
  node.pad_bottom = 2 * H * D;
  node.act_min = 0.5f;
  int32_t in_v = 0, out_v = 1;
  qpack_graph_params gp = {2, values, 1, &node, 1, &in_v, 1, &out_v};
  qpack_graph* g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && g != NULL, "attention node: create");
  qpack_tensor ti = {QPACK_DTYPE_F32, 3, {N, L, C}, QPACK_LAYOUT_NCHW, x};
  qpack_tensor to = {QPACK_DTYPE_F32, 3, {N, L, H * D}, QPACK_LAYOUT_NCHW, y};
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "attention node: run");
  const int64_t qs[3] = {L * C, D, C}, os[3] = {L * H * D, D, H * D};
  EXPECT(qpack_attention_f32(&x[0][0][0], qs, &x[0][0][H * D], qs, &x[0][0][2 * H * D], qs, &want[0][0][0], os, N,
                             H, L, L, D, 0.5f, 0) == QPACK_STATUS_SUCCESS, "attention over the same heads");
  EXPECT(memcmp(y, want, sizeof(want)) == 0, "attention node: the call's values");
  qpack_tensor narrow = {QPACK_DTYPE_F32, 3, {N, L, C - 1}, QPACK_LAYOUT_NCHW, x};
  EXPECT(qpack_graph_run(g, 1, &narrow, 1, &to) == QPACK_STATUS_INVALID_ARGUMENT &&
             strstr(qpack_last_error(), "attention") != NULL, "attention node: a value without room for v");
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "attention node: usable after");
  qpack_graph_destroy(g);
  /* a mask per group of samples ([G][H][L][S], sample n reads group n % G: Swin's windows):
     each sample's output equals a run of that sample alone with its group's [H][L][S] mask */
  static float masks[N][H][L][L];
  for (int i = 0; i < N * H * L * L; ++i) (&masks[0][0][0][0])[i] = (float)((i * 7) % 5) - 2.0f;
  node.affine_scale = &masks[0][0][0][0];
  node.channels = N * H * L * L;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS, "attention node: grouped masks");
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "attention node: grouped masks run");
  qpack_tensor odd = {QPACK_DTYPE_F32, 3, {1, L, C}, QPACK_LAYOUT_NCHW, x};
  EXPECT(qpack_graph_run(g, 1, &odd, 1, &to) == QPACK_STATUS_INVALID_ARGUMENT &&
             strstr(qpack_last_error(), "mask") != NULL, "attention node: a batch the groups do not divide");
  qpack_graph_destroy(g);
  for (int n = 0; n < N; ++n) {
    static float one[L][H * D];
    node.affine_scale = &masks[n][0][0][0];
    node.channels = H * L * L;
    g = NULL;
    EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS, "attention node: one group's mask");
    qpack_tensor tn = {QPACK_DTYPE_F32, 3, {1, L, C}, QPACK_LAYOUT_NCHW, x[n]};
    qpack_tensor on = {QPACK_DTYPE_F32, 3, {1, L, H * D}, QPACK_LAYOUT_NCHW, one};
    EXPECT(qpack_graph_run(g, 1, &tn, 1, &on) == QPACK_STATUS_SUCCESS &&
               memcmp(one, y[n], sizeof(one)) == 0,
           "attention node: sample %d reads mask group %d", n, n);
    qpack_graph_destroy(g);
  }
  /* window masks (act_max = G): the heads' [H][L][S] (0 here), then [G][L][S], sample n
     adding window n % G's: the values of the grouped form with each window's mask for
     every head; a count that is not whole or does not fit the mask is refused */
  static float windowed[H + N][L][L], grouped[N][H][L][L];
  memset(windowed, 0, sizeof(windowed));
  for (int n = 0; n < N; ++n) {
    memcpy(windowed[H + n], masks[n][0], sizeof(windowed[0]));
    for (int h = 0; h < H; ++h) memcpy(grouped[n][h], masks[n][0], sizeof(grouped[0][0]));
  }
  static float y_grouped[N][L][H * D];
  qpack_tensor tg = {QPACK_DTYPE_F32, 3, {N, L, H * D}, QPACK_LAYOUT_NCHW, y_grouped};
  node.affine_scale = &grouped[0][0][0][0];
  node.channels = N * H * L * L;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && qpack_graph_run(g, 1, &ti, 1, &tg) ==
             QPACK_STATUS_SUCCESS, "attention node: grouped masks of each window for every head");
  qpack_graph_destroy(g);
  node.affine_scale = &windowed[0][0][0];
  node.channels = (H + N) * L * L;
  node.act_max = (float)N;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && qpack_graph_run(g, 1, &ti, 1, &to) ==
             QPACK_STATUS_SUCCESS && memcmp(y, y_grouped, sizeof(y)) == 0,
         "attention node: window masks after the heads' give the grouped form's values");
  EXPECT(qpack_graph_run(g, 1, &odd, 1, &to) == QPACK_STATUS_INVALID_ARGUMENT &&
             strstr(qpack_last_error(), "mask") != NULL, "attention node: a batch the windows do not divide");
  qpack_graph_destroy(g);
  const float bad_counts[3] = {1.5f, -1.0f, (float)N + 1.0f};
  for (int i = 0; i < 3; ++i) {
    node.act_max = bad_counts[i];
    g = NULL;
    EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL &&
               strstr(qpack_last_error(), "window mask count") != NULL,
           "attention node: refuses %g window masks", bad_counts[i]);
  }
  node.act_max = 0.0f;
  node.affine_scale = NULL;
  node.channels = 0;
  node.kernel_h = 0;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL &&
             strstr(qpack_last_error(), "heads") != NULL, "attention node: refuses 0 heads");
}

/* ViT's prefix: a class token over the batch concatenated before the tokens, then a
 * position embedding over the batch added (CONSTANT, CONCAT, CONSTANT, ADD). */
static void test_graph_constant(void) {
  enum { N = 2, L = 3, C = 4 };
  const float cls[C] = {1, 2, 3, 4};
  float pos[(L + 1) * C], x[N][L][C], y[N][L + 1][C];
  for (int i = 0; i < (L + 1) * C; ++i) pos[i] = 0.25f * (float)i;
  for (int i = 0; i < N * L * C; ++i) (&x[0][0][0])[i] = (float)(i % 7) - 3.0f;
  qpack_graph_value values[5];
  for (int i = 0; i < 5; ++i) values[i] = (qpack_graph_value){QPACK_DTYPE_F32, 0, 0};
  qpack_graph_node nodes[4];
  memset(nodes, 0, sizeof(nodes));
  nodes[0].kind = QPACK_NODE_CONSTANT; /* value 1: [N, 1, C] */
  nodes[0].num_inputs = 1;
  nodes[0].output = 1;
  nodes[0].kernel_h = 1;
  nodes[0].kernel_w = C;
  nodes[0].affine_scale = cls;
  nodes[0].channels = C;
  nodes[1].kind = QPACK_NODE_CONCAT; /* value 2: [N, L + 1, C] */
  nodes[1].inputs[0] = 1;
  nodes[1].inputs[1] = 0;
  nodes[1].num_inputs = 2;
  nodes[1].output = 2;
  nodes[2].kind = QPACK_NODE_CONSTANT; /* value 3: the embedding over the batch */
  nodes[2].inputs[0] = 2;
  nodes[2].num_inputs = 1;
  nodes[2].output = 3;
  nodes[2].kernel_h = L + 1;
  nodes[2].kernel_w = C;
  nodes[2].affine_scale = pos;
  nodes[2].channels = (L + 1) * C;
  nodes[3].kind = QPACK_NODE_ADD;
  nodes[3].inputs[0] = 2;
  nodes[3].inputs[1] = 3;
  nodes[3].num_inputs = 2;
  nodes[3].output = 4;
  int32_t in_v = 0, out_v = 4;
  qpack_graph_params gp = {5, values, 4, nodes, 1, &in_v, 1, &out_v};
  qpack_graph* g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && g != NULL, "constant: create");
  qpack_tensor ti = {QPACK_DTYPE_F32, 3, {N, L, C}, QPACK_LAYOUT_NCHW, x};
  qpack_tensor to = {QPACK_DTYPE_F32, 3, {N, L + 1, C}, QPACK_LAYOUT_NCHW, y};
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "constant: run");
  int same = 1;
  for (int n = 0; n < N; ++n) {
    for (int l = 0; l <= L; ++l) {
      for (int c = 0; c < C; ++c) {
        const float t = l == 0 ? cls[c] : x[n][l - 1][c];
        same &= y[n][l][c] == t + pos[l * C + c];
      }
    }
  }
  EXPECT(same, "constant: the class token and the embedding over the batch");
  qpack_graph_info info;
  EXPECT(qpack_graph_get_info(g, &info) == QPACK_STATUS_SUCCESS &&
             info.nbytes_constants == sizeof(cls) + sizeof(pos) && info.nbytes_packed == 0,
         "constant: the graph's copies counted (%zu bytes)", info.nbytes_constants);
  qpack_tensor longer = {QPACK_DTYPE_F32, 3, {N, L + 1, C}, QPACK_LAYOUT_NCHW, x};
  float y2[N][L + 2][C];
  qpack_tensor to2 = {QPACK_DTYPE_F32, 3, {N, L + 2, C}, QPACK_LAYOUT_NCHW, y2};
  EXPECT(qpack_graph_run(g, 1, &longer, 1, &to2) == QPACK_STATUS_INVALID_ARGUMENT &&
             strstr(qpack_last_error(), "add takes equal shapes") != NULL,
         "constant: an embedding of other tokens");
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "constant: usable after");
  qpack_graph_destroy(g);
  nodes[2].channels = L * C;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL &&
             strstr(qpack_last_error(), "constant") != NULL,
         "constant: refuses a table of another size than rows x columns");
}

/* F.pad of an image: one row above, two columns right, the border 0.5. */
static void test_graph_pad(void) {
  enum { C = 2, H = 2, W = 3, OH = 3, OW = 5 };
  float x[C][H][W], y[C][OH][OW];
  for (int i = 0; i < C * H * W; ++i) (&x[0][0][0])[i] = (float)i;
  qpack_graph_value values[2] = {{QPACK_DTYPE_F32, 0, 0}, {QPACK_DTYPE_F32, 0, 0}};
  qpack_graph_node node;
  memset(&node, 0, sizeof(node));
  node.kind = QPACK_NODE_PAD;
  node.num_inputs = 1;
  node.output = 1;
  node.pad_top = 1;
  node.pad_right = 2;
  node.act_min = 0.5f;
  int32_t in_v = 0, out_v = 1;
  qpack_graph_params gp = {2, values, 1, &node, 1, &in_v, 1, &out_v};
  qpack_graph* g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && g != NULL, "pad: create");
  qpack_tensor ti = {QPACK_DTYPE_F32, 4, {1, C, H, W}, QPACK_LAYOUT_NCHW, x};
  qpack_tensor to = {QPACK_DTYPE_F32, 4, {1, C, OH, OW}, QPACK_LAYOUT_NCHW, y};
  EXPECT(qpack_graph_run(g, 1, &ti, 1, &to) == QPACK_STATUS_SUCCESS, "pad: run");
  int same = 1;
  for (int c = 0; c < C; ++c) {
    for (int i = 0; i < OH; ++i) {
      for (int j = 0; j < OW; ++j) same &= y[c][i][j] == (i >= 1 && j < W ? x[c][i - 1][j] : 0.5f);
    }
  }
  EXPECT(same, "pad: the image inside its border");
  qpack_graph_destroy(g);
  node.pad_left = -1;
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL &&
             strstr(qpack_last_error(), "pad") != NULL,
         "pad: refuses a negative pad");
}

/* MobileViT's unfold of a 2x4 image of 3 channels into 2x2 patches: tokens [4, 2, 3], then
   the fold back to the image (the inverse permutation, 8 rows a block). */
static void test_graph_permute_rows(void) {
  enum { C = 3, H = 2, W = 4, R = H * W };
  float x[C][H][W], tok[4][2][C], back[C][H][W];
  for (int i = 0; i < C * R; ++i) (&x[0][0][0])[i] = (float)i - 7.5f;
  float unfold[R], fold[R];
  for (int py = 0; py < 2; ++py) {
    for (int px = 0; px < 2; ++px) {
      for (int n = 0; n < 2; ++n) { /* patch n (along W), its pixel (py, px) */
        const int out = (py * 2 + px) * 2 + n, src = py * W + n * 2 + px;
        unfold[out] = (float)src;
        fold[src] = (float)out;
      }
    }
  }
  qpack_graph_value values[3] = {{QPACK_DTYPE_F32, 0, 0}, {QPACK_DTYPE_F32, 0, 0}, {QPACK_DTYPE_F32, 0, 0}};
  qpack_graph_node nodes[2];
  memset(nodes, 0, sizeof(nodes));
  nodes[0].kind = QPACK_NODE_PERMUTE_ROWS; /* value 1: tokens [4, 2, C] */
  nodes[0].num_inputs = 1;
  nodes[0].output = 1;
  nodes[0].kernel_h = 2;
  nodes[0].affine_scale = unfold;
  nodes[0].channels = R;
  nodes[1] = nodes[0]; /* value 2: the image again */
  nodes[1].inputs[0] = 1;
  nodes[1].output = 2;
  nodes[1].kernel_h = H;
  nodes[1].kernel_w = W;
  nodes[1].affine_scale = fold;
  int32_t in_v = 0, outs[2] = {1, 2};
  qpack_graph_params gp = {3, values, 2, nodes, 1, &in_v, 2, outs};
  qpack_graph* g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_SUCCESS && g != NULL, "permute_rows: create");
  qpack_tensor ti = {QPACK_DTYPE_F32, 4, {1, C, H, W}, QPACK_LAYOUT_NCHW, x};
  qpack_tensor to[2] = {{QPACK_DTYPE_F32, 3, {4, 2, C}, QPACK_LAYOUT_NCHW, tok},
                        {QPACK_DTYPE_F32, 4, {1, C, H, W}, QPACK_LAYOUT_NCHW, back}};
  EXPECT(qpack_graph_run(g, 1, &ti, 2, to) == QPACK_STATUS_SUCCESS, "permute_rows: run");
  int same = 1;
  for (int t = 0; t < R; ++t) {
    const int src = (int)unfold[t];
    for (int c = 0; c < C; ++c) same &= (&tok[0][0][0])[t * C + c] == x[c][src / W][src % W];
  }
  EXPECT(same, "permute_rows: the patches' pixels as tokens");
  EXPECT(memcmp(x, back, sizeof(x)) == 0, "permute_rows: folded back to the image");
  qpack_graph_destroy(g);
  unfold[3] = unfold[2];
  g = NULL;
  EXPECT(qpack_graph_create(&gp, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL &&
             strstr(qpack_last_error(), "permutation") != NULL,
         "permute_rows: refuses a row named twice");
}

int main(void) {
  char buf[256];
  for (int i = 0; i < qpack_backend_count(); ++i) {
    qpack_backend_info b;
    EXPECT(qpack_backend_get_info(i, &b) == QPACK_STATUS_SUCCESS, "backend info");
    EXPECT(qpack_backend_describe(b.backend, buf, sizeof(buf)) == QPACK_STATUS_SUCCESS, "describe");
    printf("%s: %s\n", b.name, buf);
  }
  test_build_info();
  if (have_mode(0, QPACK_MODE_F32)) {
    test_f32();
  } else {
    printf("skip f32 linear: no backend of this build has f32 (oneDNN is not compiled in)\n");
  }
  test_int8_backends_agree();
  test_bad_params();
  test_retain_policy();
  test_threads();
  test_graph();
  if (have_mode(1, QPACK_MODE_F32)) {
    test_graph_fused_add();
  } else {
    printf("skip the fused add: no backend of this build has f32 convolutions\n");
  }
  test_graph_prelu_resize();
  test_attention();
  test_attention_mask();
  test_graph_attention();
  test_graph_constant();
  test_graph_pad();
  test_graph_permute_rows();
  printf("c_api: %d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
