/* ARM vs x86: the same fixed inputs through QNNPACK's int8 linear and conv.
 *
 *   qpack_golden write FILE     (x86 build: writes every output)
 *   qpack_golden compare FILE   (aarch64 build under qemu: compares with FILE)
 *
 * Inputs come from a fixed integer generator, so both builds see the same
 * bytes. The comparison passes when every output byte is equal or off by one
 * quantum, and prints how many were equal; it fails on a larger difference or
 * a different set of cases.
 *
 * Model files across ISAs: `write` also saves every op to FILE.qpk (x86
 * packing: QNNPACK's SSE2 blocking); `compare` loads it on ARM, where the
 * blocking differs, so each op is decoded from the x86 packed bytes and
 * re-packed, and its outputs must equal those of the op packed on ARM from
 * the original weights, byte for byte. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qpack/qpack.h"

static uint32_t g_state = 12345u;
static uint32_t next_u32(void) {
  g_state = g_state * 1664525u + 1013904223u;
  return g_state >> 8;
}
static void fill_s8(int8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = (int8_t)((int)(next_u32() % 255u) - 127);
}
static void fill_u8(uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = (uint8_t)(next_u32() % 256u);
}
static void fill_scales(float* p, size_t n, float base) {
  for (size_t i = 0; i < n; ++i) p[i] = base * (float)(1 + next_u32() % 16u) / 8.0f;
}
static void fill_bias(float* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = (float)((int)(next_u32() % 401u) - 200) / 50.0f;
}

typedef struct {
  char name[64];
  size_t size;
  uint8_t* data;
  /* to run the same case on an op loaded from a model file */
  qpack_linear* lin;
  qpack_conv2d* conv;
  uint8_t* x;
  int64_t m, h, w;
} result;

enum { kMaxResults = 64 };
static result g_results[kMaxResults];
static int g_count = 0;

static result* add_result(const char* name, const uint8_t* data, size_t size) {
  if (g_count == kMaxResults) {
    fprintf(stderr, "too many cases\n");
    exit(2);
  }
  result* r = &g_results[g_count++];
  memset(r, 0, sizeof(*r));
  snprintf(r->name, sizeof(r->name), "%s", name);
  r->size = size;
  r->data = (uint8_t*)malloc(size ? size : 1);
  memcpy(r->data, data, size);
  return r;
}

static int check(qpack_status s, const char* what) {
  if (s != QPACK_STATUS_SUCCESS) {
    fprintf(stderr, "%s failed: %s\n", what, qpack_last_error());
    exit(2);
  }
  return 1;
}

static void linear_case(int64_t m, int64_t k, int64_t n, int per_channel, int relu) {
  int8_t* w = (int8_t*)malloc((size_t)(n * k));
  float* scales = (float*)malloc(sizeof(float) * (size_t)n);
  float* bias = (float*)malloc(sizeof(float) * (size_t)n);
  uint8_t* x = (uint8_t*)malloc((size_t)(m * k));
  uint8_t* y = (uint8_t*)malloc((size_t)(m * n));
  fill_s8(w, (size_t)(n * k));
  fill_scales(scales, (size_t)n, 0.002f);
  fill_bias(bias, (size_t)n);
  fill_u8(x, (size_t)(m * k));
  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = k;
  p.out_features = n;
  p.mode = QPACK_MODE_INT8_STATIC;
  p.backend = QPACK_BACKEND_QNNPACK;
  p.weight = w;
  p.weight_scales = scales;
  p.num_weight_scales = per_channel ? n : 1;
  p.bias = bias;
  if (relu) p.clamp_min = 0.0f;
  p.output_scale = 0.15f;
  p.output_zero_point = 100;
  qpack_linear* lin = NULL;
  check(qpack_linear_create(&p, &lin), "linear create");
  check(qpack_linear_run_u8(lin, m, x, 0.04f, 121, y), "linear run");
  char name[64];
  snprintf(name, sizeof(name), "linear m%lld k%lld n%lld %s%s", (long long)m, (long long)k,
           (long long)n, per_channel ? "per-channel" : "per-tensor", relu ? " relu" : "");
  result* r = add_result(name, y, (size_t)(m * n));
  r->lin = lin, r->x = x, r->m = m;
  free(w), free(scales), free(bias), free(y);
}

static void conv_case(int64_t c_in, int64_t c_out, int64_t groups, int64_t kh, int64_t kw,
                      int64_t stride, int64_t pad, int64_t dilation, int64_t h, int64_t wd) {
  const size_t wn = (size_t)(c_out * (c_in / groups) * kh * kw);
  int8_t* w = (int8_t*)malloc(wn);
  float* scales = (float*)malloc(sizeof(float) * (size_t)c_out);
  float* bias = (float*)malloc(sizeof(float) * (size_t)c_out);
  uint8_t* x = (uint8_t*)malloc((size_t)(c_in * h * wd));
  fill_s8(w, wn);
  fill_scales(scales, (size_t)c_out, 0.003f);
  fill_bias(bias, (size_t)c_out);
  fill_u8(x, (size_t)(c_in * h * wd));
  qpack_conv2d_params p;
  qpack_conv2d_params_init(&p);
  p.in_channels = c_in;
  p.out_channels = c_out;
  p.groups = groups;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = p.stride_w = stride;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.mode = QPACK_MODE_INT8_STATIC;
  p.backend = QPACK_BACKEND_QNNPACK;
  p.weight = w;
  p.weight_scales = scales;
  p.num_weight_scales = c_out;
  p.bias = bias;
  p.output_scale = 0.2f;
  p.output_zero_point = 90;
  qpack_conv2d* conv = NULL;
  check(qpack_conv2d_create(&p, &conv), "conv create");
  int64_t oh = 0, ow = 0;
  check(qpack_conv2d_output_size(conv, h, wd, &oh, &ow), "conv output size");
  const size_t yn = (size_t)(c_out * oh * ow);
  uint8_t* y = (uint8_t*)malloc(yn);
  check(qpack_conv2d_run_u8(conv, 1, h, wd, QPACK_LAYOUT_NHWC, x, 0.05f, 110, QPACK_LAYOUT_NHWC, y),
        "conv run");
  char name[64];
  snprintf(name, sizeof(name), "conv %lldx%lld %lld->%lld g%lld s%lld p%lld d%lld %lldx%lld",
           (long long)kh, (long long)kw, (long long)c_in, (long long)c_out, (long long)groups,
           (long long)stride, (long long)pad, (long long)dilation, (long long)h, (long long)wd);
  result* r = add_result(name, y, yn);
  r->conv = conv, r->x = x, r->h = h, r->w = wd;
  free(w), free(scales), free(bias), free(y);
}

static void run_cases(void) {
  linear_case(1, 16, 8, 1, 0);
  linear_case(5, 37, 21, 1, 0);
  linear_case(33, 130, 64, 1, 1);
  linear_case(8, 512, 40, 0, 0);
  linear_case(4, 1024, 9, 1, 0);
  conv_case(3, 8, 1, 3, 3, 1, 1, 1, 11, 9);      /* first layer */
  conv_case(16, 24, 1, 1, 1, 1, 0, 1, 7, 7);     /* pointwise */
  conv_case(32, 32, 32, 3, 3, 1, 1, 1, 10, 10);  /* depthwise 3x3 */
  conv_case(24, 24, 24, 3, 3, 2, 1, 1, 9, 9);    /* depthwise 3x3 stride 2 */
  conv_case(10, 10, 10, 5, 5, 1, 2, 1, 8, 8);    /* depthwise 5x5 */
  conv_case(8, 12, 4, 3, 3, 1, 2, 2, 9, 9);      /* grouped, dilated */
  conv_case(64, 64, 1, 3, 3, 1, 1, 1, 8, 8);     /* 3x3 64->64 */
}

/* The outputs of op `index` of a loaded model file on case r's input. */
static void run_loaded(const qpack_model* model, int index, const result* r, uint8_t* y) {
  if (r->lin) {
    qpack_linear* lin = NULL;
    check(qpack_model_linear(model, index, &lin), "model linear");
    check(qpack_linear_run_u8(lin, r->m, r->x, 0.04f, 121, y), "loaded linear run");
    qpack_linear_destroy(lin);
  } else {
    qpack_conv2d* conv = NULL;
    check(qpack_model_conv2d(model, index, &conv), "model conv");
    check(qpack_conv2d_run_u8(conv, 1, r->h, r->w, QPACK_LAYOUT_NHWC, r->x, 0.05f, 110,
                              QPACK_LAYOUT_NHWC, y),
          "loaded conv run");
    qpack_conv2d_destroy(conv);
  }
}

/* Loads path and runs every case on its op: 0 when all outputs equal this
 * build's own, byte for byte. `expect_repacked`: how many ops must have been
 * re-packed (-1: any). */
static int check_model_file(const char* path, int expect_repacked) {
  qpack_model* model = NULL;
  check(qpack_model_load(path, NULL, &model), "model load");
  qpack_model_info info;
  check(qpack_model_get_info(model, &info), "model info");
  int different = 0;
  for (int i = 0; i < g_count; ++i) {
    uint8_t* y = (uint8_t*)malloc(g_results[i].size ? g_results[i].size : 1);
    run_loaded(model, i, &g_results[i], y);
    different += memcmp(y, g_results[i].data, g_results[i].size) != 0;
    free(y);
  }
  char why[512] = "";
  if (info.num_repacked > 0) qpack_model_repacked(model, 0, why, sizeof(why));
  printf("model file: %d ops, %d re-packed%s%s, %zu bytes used in place; %d with outputs "
         "different from this build's own packing\n",
         info.num_ops, info.num_repacked, info.num_repacked ? ", e.g. " : "", why,
         info.nbytes_in_place, different);
  qpack_model_destroy(model);
  const int ok = info.num_ops == g_count && different == 0 &&
                 (expect_repacked < 0 || info.num_repacked == expect_repacked);
  if (!ok) fprintf(stderr, "FAIL: model file %s\n", path);
  return ok ? 0 : 1;
}

static void save_model_file(const char* path) {
  const qpack_linear* lins[kMaxResults];
  const qpack_conv2d* convs[kMaxResults];
  qpack_save_params p;
  memset(&p, 0, sizeof(p));
  for (int i = 0; i < g_count; ++i) {
    if (g_results[i].lin) lins[p.num_linears++] = g_results[i].lin;
  }
  for (int i = 0; i < g_count; ++i) {
    if (g_results[i].conv) convs[p.num_convs++] = g_results[i].conv;
  }
  p.linears = lins;
  p.convs = convs;
  check(qpack_model_save(&p, path), "model save");
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "write") != 0 && strcmp(argv[1], "compare") != 0)) {
    fprintf(stderr, "usage: %s write|compare FILE\n", argv[0]);
    return 2;
  }
  char info[256];
  qpack_build_info_string(info, sizeof(info));
  printf("%s\n", info);
  run_cases();
  if (strcmp(argv[1], "write") == 0) {
    FILE* f = fopen(argv[2], "wb");
    if (!f) return 2;
    fprintf(f, "%s\n", info);
    for (int i = 0; i < g_count; ++i) {
      fprintf(f, "%s|%zu\n", g_results[i].name, g_results[i].size);
      fwrite(g_results[i].data, 1, g_results[i].size, f);
      fputc('\n', f);
    }
    fclose(f);
    printf("golden: wrote %d cases to %s\n", g_count, argv[2]);
    char qpk[4096];
    snprintf(qpk, sizeof(qpk), "%s.qpk", argv[2]);
    save_model_file(qpk);
    return check_model_file(qpk, 0);  /* this build: every op in place */
  }
  FILE* f = fopen(argv[2], "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s (the x86 build writes it: make cross-test)\n", argv[2]);
    return 2;
  }
  char line[512];
  if (!fgets(line, sizeof(line), f)) return 2;
  printf("reference: %s", line);
  int failures = 0;
  size_t total = 0, equal = 0, off_by_one = 0;
  for (int i = 0; i < g_count; ++i) {
    const result* r = &g_results[i];
    size_t size = 0;
    if (!fgets(line, sizeof(line), f)) {
      fprintf(stderr, "FAIL: reference ends before case %s\n", r->name);
      return 1;
    }
    char* bar = strrchr(line, '|');
    if (!bar) return 2;
    *bar = '\0';
    size = (size_t)strtoull(bar + 1, NULL, 10);
    if (strcmp(line, r->name) != 0 || size != r->size) {
      fprintf(stderr, "FAIL: case %d is '%s' (%zu bytes) here, '%s' (%zu) in the reference\n", i,
              r->name, r->size, line, size);
      return 1;
    }
    uint8_t* ref = (uint8_t*)malloc(size ? size : 1);
    if (fread(ref, 1, size, f) != size || fgetc(f) != '\n') return 2;
    size_t eq = 0, one = 0, worse = 0;
    for (size_t j = 0; j < size; ++j) {
      int d = abs((int)ref[j] - (int)r->data[j]);
      eq += d == 0;
      one += d == 1;
      worse += d > 1;
    }
    printf("%-44s %6zu outputs: %6zu equal, %4zu off by 1, %zu worse\n", r->name, size, eq, one,
           worse);
    total += size, equal += eq, off_by_one += one;
    failures += worse > 0;
    free(ref);
  }
  fclose(f);
  printf("golden: %d cases, %zu outputs, %zu equal, %zu off by one quantum, %d cases worse\n",
         g_count, total, equal, off_by_one, failures);
  char qpk[4096];
  snprintf(qpk, sizeof(qpk), "%s.qpk", argv[2]);
  failures += check_model_file(qpk, -1);
  for (int i = 0; i < g_count; ++i) {
    qpack_linear_destroy(g_results[i].lin);
    qpack_conv2d_destroy(g_results[i].conv);
    free(g_results[i].x);
    free(g_results[i].data);
  }
  return failures == 0 ? 0 : 1;
}
