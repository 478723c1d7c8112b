/*
 * Packed model files (.qpk, docs/FORMAT.md) from plain C:
 *
 *   1. round trips on every available backend, op and mode: create -> save ->
 *      load (mapped and read) -> outputs bit-identical, unpack bit-exact (also
 *      after release_original on the loaded op), info equal; graphs saved with
 *      qpack_graph_save run bit-identical; the qpack_model_* accessors (DATA
 *      sections and host bytes included) and their bad arguments;
 *   2. corruption of small files: every byte flipped (xor 0xFF, and one bit)
 *      and loaded with verify: FILE_FORMAT, or for the padding that no
 *      checksum covers a load equal to the pristine one (every variant
 *      loaded, a sample run and compared); without verify for the header,
 *      table and record bytes: FILE_FORMAT or a load whose every run and
 *      unpack completes. Then record fields set to boundary values, header
 *      and table bytes flipped with their checksums recomputed ("resealed"),
 *      hostile layouts written into resealed op records, another build's
 *      identifiers (re-packed to the same outputs; refused with strict), and
 *      truncation at every length;
 *   3. IO errors (qpack_model_load_fd included), and saving over a file that
 *      live handles map; concurrent loads and runs of a loaded op.
 *
 * Files go to a mkdtemp folder that is removed at the end. The corruption
 * counts are printed (one block per file). QPACK_TEST_TRACE=1 prints each
 * variant before it is loaded, to find the one that crashes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

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

#define OK(call) ((call) == QPACK_STATUS_SUCCESS)

static char g_dir[512];

static void path_in(char* out, size_t size, const char* name) {
  snprintf(out, size, "%s/%s", g_dir, name);
}

/* QPACK_TEST_TRACE=1: each corrupt variant is printed before it is loaded
 * (to find the one that crashes). */
static int g_trace = 0;
static void trace(const char* fmt, ...) {
  if (!g_trace) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- deterministic data -------------------------------------------------- */

static uint32_t lcg(uint32_t* s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}
static void fill_f32(float* p, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = 0; i < n; ++i) p[i] = lo + (hi - lo) * (float)(lcg(&seed) & 0xFFFF) / 65535.0f;
}
static void fill_s8(int8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (int8_t)((int)(lcg(&seed) % 255) - 127);
}
static void fill_u8(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (uint8_t)(lcg(&seed) & 0xFF);
}

/* ---- files ---------------------------------------------------------------- */

static uint8_t* read_file(const char* path, size_t* size_out) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t* p = malloc(n > 0 ? (size_t)n : 1);
  if (p != NULL && n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n) {
    free(p);
    p = NULL;
  }
  fclose(f);
  *size_out = (size_t)n;
  return p;
}

static int write_file(const char* path, const void* data, size_t size) {
  FILE* f = fopen(path, "wb");
  if (f == NULL) return 0;
  int ok = size == 0 || fwrite(data, 1, size, f) == size;
  return fclose(f) == 0 && ok;
}

static int pwrite_all(int fd, const void* data, size_t size, off_t at) {
  const uint8_t* p = data;
  while (size > 0) {
    ssize_t n = pwrite(fd, p, size, at);
    if (n <= 0) return 0;
    p += n;
    size -= (size_t)n;
    at += n;
  }
  return 1;
}

/* Entries of g_dir whose name contains `part`. */
static int count_entries(const char* part) {
  DIR* d = opendir(g_dir);
  int n = 0;
  if (d == NULL) return -1;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && strstr(e->d_name, part)) ++n;
  }
  closedir(d);
  return n;
}

static void remove_tree(const char* dir) {
  DIR* d = opendir(dir);
  if (d == NULL) return;
  struct dirent* e;
  char p[1024];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
      chmod(p, 0700);
      remove_tree(p);
    } else {
      unlink(p);
    }
  }
  closedir(d);
  rmdir(dir);
}

/* ---- backends --------------------------------------------------------------- */

typedef struct {
  qpack_backend id;
  const char* name;
  unsigned linear_modes, conv2d_modes;
} backend_t;

static backend_t g_backends[4];
static int g_num_backends = 0;

static void find_backends(void) {
  for (int i = 0; i < qpack_backend_count() && g_num_backends < 4; ++i) {
    qpack_backend_info b;
    if (!OK(qpack_backend_get_info(i, &b)) || !b.available) continue;
    backend_t* t = &g_backends[g_num_backends++];
    t->id = b.backend;
    t->name = b.name;
    t->linear_modes = b.linear_modes;
    t->conv2d_modes = b.conv2d_modes;
  }
}

static const backend_t* find_backend(qpack_backend id) {
  for (int i = 0; i < g_num_backends; ++i) {
    if (g_backends[i].id == id) return &g_backends[i];
  }
  return NULL;
}

static const char* mode_name(qpack_mode m) {
  return m == QPACK_MODE_F32 ? "f32" : m == QPACK_MODE_INT8_STATIC ? "int8-static" : "int8-dynamic";
}

/* ---- a growing byte buffer: every output and unpacked weight of a model ------ */

typedef struct {
  uint8_t* p;
  size_t n, cap;
} bytes_t;

static void put_bytes(bytes_t* b, const void* data, size_t n) {
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n) cap *= 2;
    b->p = realloc(b->p, cap);
    b->cap = cap;
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}
static int same_bytes(const bytes_t* a, const bytes_t* b) {
  return a->n == b->n && (a->n == 0 || memcmp(a->p, b->p, a->n) == 0);
}

/* ---- running an op the same way on any handle -------------------------------- */

/* Run buffers with 16 readable bytes on both sides: QNNPACK's kernels read up
 * to 7 bytes before an input row (PyTorch's mobile allocator keeps such guard
 * bytes for them). A caller's buffer without them can fault; that is not what
 * this file tests. */
static void* guarded_alloc(size_t n) { return (uint8_t*)malloc(n + 32) + 16; }
static void guarded_free(void* p) { free((uint8_t*)p - 16); }

enum { RUN_BATCH = 3, CONV_BATCH = 2, CONV_H = 9, CONV_W = 8, MAX_ELEMS = 1 << 20 };

/* Outputs of a linear on fixed inputs: f32 for F32/dynamic; u8 at two input
 * scales for static int8 (the first its expected one, the second another: a
 * QNNPACK op then builds a state for it, copy-on-write from the loaded one).
 * Returns the first failing status. */
static qpack_status run_linear(const qpack_linear* l, float s_in, int32_t zp_in, bytes_t* out) {
  qpack_linear_info info;
  qpack_status st = qpack_linear_get_info(l, &info);
  if (st != QPACK_STATUS_SUCCESS) return st;
  if (info.in_features * RUN_BATCH > MAX_ELEMS || info.out_features * RUN_BATCH > MAX_ELEMS) {
    return QPACK_STATUS_OUT_OF_MEMORY; /* a corrupt op accepted without verify: too big to run */
  }
  const size_t nx = (size_t)(info.in_features * RUN_BATCH), ny = (size_t)(info.out_features * RUN_BATCH);
  void* x = guarded_alloc(nx * sizeof(float));
  void* y = guarded_alloc(ny * sizeof(float));
  if (info.mode == QPACK_MODE_INT8_STATIC) {
    const float scales[2] = {s_in, 0.0371f};
    const int32_t zps[2] = {zp_in, 117};
    fill_u8(x, nx, 7);
    for (int i = 0; i < 2 && st == QPACK_STATUS_SUCCESS; ++i) {
      memset(y, 0xA5, ny);
      st = qpack_linear_run_u8(l, RUN_BATCH, x, scales[i], zps[i], y);
      put_bytes(out, y, ny);
    }
  } else {
    fill_f32(x, nx, 7, -2.0f, 2.0f);
    memset(y, 0xA5, ny * sizeof(float));
    st = qpack_linear_run_f32(l, RUN_BATCH, x, y);
    put_bytes(out, y, ny * sizeof(float));
  }
  guarded_free(x);
  guarded_free(y);
  return st;
}

/* Unpacked weight and bias (the weight's element size by mode). */
static qpack_status unpack_linear(const qpack_linear* l, bytes_t* out) {
  qpack_linear_info info;
  qpack_status st = qpack_linear_get_info(l, &info);
  if (st != QPACK_STATUS_SUCCESS) return st;
  const size_t elem = info.mode == QPACK_MODE_F32 ? 4 : 1;
  const size_t nw = (size_t)(info.in_features * info.out_features);
  if (nw > MAX_ELEMS) return QPACK_STATUS_OUT_OF_MEMORY;
  void* w = malloc(nw * elem);
  float* b = malloc((size_t)info.out_features * sizeof(float));
  st = qpack_linear_unpack(l, w, b);
  if (st == QPACK_STATUS_SUCCESS) {
    put_bytes(out, w, nw * elem);
    put_bytes(out, b, (size_t)info.out_features * sizeof(float));
  }
  free(w);
  free(b);
  return st;
}

static qpack_status run_conv(const qpack_conv2d* c, float s_in, int32_t zp_in, bytes_t* out) {
  qpack_conv2d_info info;
  qpack_status st = qpack_conv2d_get_info(c, &info);
  if (st != QPACK_STATUS_SUCCESS) return st;
  int64_t oh = 0, ow = 0;
  st = qpack_conv2d_output_size(c, CONV_H, CONV_W, &oh, &ow);
  if (st != QPACK_STATUS_SUCCESS) return st;
  if (info.in_channels > 4096 || info.out_channels > 4096 || oh * ow > 65536 ||
      info.out_channels * oh * ow * CONV_BATCH > MAX_ELEMS) {
    return QPACK_STATUS_OUT_OF_MEMORY;
  }
  const size_t nx = (size_t)(CONV_BATCH * info.in_channels * CONV_H * CONV_W);
  const size_t ny = (size_t)(CONV_BATCH * info.out_channels * oh * ow);
  void* x = guarded_alloc(nx * sizeof(float));
  void* y = guarded_alloc((ny ? ny : 1) * sizeof(float));
  const qpack_layout layouts[2] = {QPACK_LAYOUT_NCHW, QPACK_LAYOUT_NHWC};
  if (info.mode == QPACK_MODE_INT8_STATIC) {
    const float scales[2] = {s_in, 0.0371f};
    const int32_t zps[2] = {zp_in, 117};
    fill_u8(x, nx, 11);
    for (int i = 0; i < 2 && st == QPACK_STATUS_SUCCESS; ++i) {
      for (int l = 0; l < 2 && st == QPACK_STATUS_SUCCESS; ++l) {
        memset(y, 0xA5, ny);
        st = qpack_conv2d_run_u8(c, CONV_BATCH, CONV_H, CONV_W, layouts[l], x, scales[i], zps[i],
                                 layouts[1 - l], y);
        put_bytes(out, y, ny);
      }
    }
  } else {
    fill_f32(x, nx, 11, -2.0f, 2.0f);
    for (int l = 0; l < 2 && st == QPACK_STATUS_SUCCESS; ++l) {
      memset(y, 0xA5, ny * sizeof(float));
      st = qpack_conv2d_run_f32(c, CONV_BATCH, CONV_H, CONV_W, layouts[l], x, layouts[l], y);
      put_bytes(out, y, ny * sizeof(float));
    }
  }
  guarded_free(x);
  guarded_free(y);
  return st;
}

static qpack_status unpack_conv(const qpack_conv2d* c, bytes_t* out) {
  qpack_conv2d_info info;
  qpack_status st = qpack_conv2d_get_info(c, &info);
  if (st != QPACK_STATUS_SUCCESS) return st;
  const size_t elem = info.mode == QPACK_MODE_F32 ? 4 : 1;
  if (info.groups < 1 || info.in_channels > 4096 || info.out_channels > 4096 ||
      info.kernel_h * info.kernel_w > 4096) {
    return QPACK_STATUS_OUT_OF_MEMORY;
  }
  const size_t nw = (size_t)(info.out_channels * (info.in_channels / info.groups) * info.kernel_h *
                             info.kernel_w);
  if (nw > MAX_ELEMS) return QPACK_STATUS_OUT_OF_MEMORY;
  void* w = malloc(nw * elem);
  float* b = malloc((size_t)info.out_channels * sizeof(float));
  st = qpack_conv2d_unpack(c, w, b);
  if (st == QPACK_STATUS_SUCCESS) {
    put_bytes(out, w, nw * elem);
    put_bytes(out, b, (size_t)info.out_channels * sizeof(float));
  }
  free(w);
  free(b);
  return st;
}

/* The graphs of this file take one f32 input [2, 4, 7, 7] (NCHW). */
enum { G_N = 2, G_C = 4, G_H = 7, G_W = 7 };

static qpack_status run_graph(const qpack_graph* g, bytes_t* out) {
  float x[G_N * G_C * G_H * G_W];
  fill_f32(x, sizeof x / sizeof x[0], 23, -1.5f, 1.5f);
  qpack_tensor ti = {QPACK_DTYPE_F32, 4, {G_N, G_C, G_H, G_W}, QPACK_LAYOUT_NCHW, x};
  qpack_graph_info gi;
  qpack_status st = qpack_graph_get_info(g, &gi);
  if (st != QPACK_STATUS_SUCCESS) return st;
  if (gi.num_outputs < 1 || gi.num_outputs > 16) return QPACK_STATUS_INVALID_ARGUMENT;
  qpack_tensor to[16];
  memset(to, 0, sizeof to);
  st = qpack_graph_output_shapes(g, 1, &ti, gi.num_outputs, to);
  if (st != QPACK_STATUS_SUCCESS) return st;
  size_t total = 0, numel[16];
  for (int i = 0; i < gi.num_outputs; ++i) {
    numel[i] = 1;
    for (int d = 0; d < to[i].ndim; ++d) numel[i] *= (size_t)to[i].dims[d];
    if (numel[i] > MAX_ELEMS) return QPACK_STATUS_OUT_OF_MEMORY;
    to[i].layout = QPACK_LAYOUT_NCHW;
    total += numel[i] * (to[i].dtype == QPACK_DTYPE_F32 ? 4 : 1);
  }
  uint8_t* buf = guarded_alloc(total ? total : 1);
  memset(buf, 0xA5, total);
  size_t at = 0;
  for (int i = 0; i < gi.num_outputs; ++i) {
    to[i].data = buf + at;
    at += numel[i] * (to[i].dtype == QPACK_DTYPE_F32 ? 4 : 1);
  }
  st = qpack_graph_run(g, 1, &ti, gi.num_outputs, to);
  put_bytes(out, buf, total);
  guarded_free(buf);
  return st;
}

/* Everything a model file gives, run on fixed inputs: each op's outputs and
 * unpacked weights (and, when the file kept the original, the weight again
 * from the packed bytes after release_original), each DATA section's bytes,
 * each graph's outputs.
 * Returns the number of calls that failed (0 for a sound model). */
static int probe_model(const qpack_model* m, float s_in, int32_t zp_in, bytes_t* out) {
  qpack_model_info mi;
  int failed = 0;
  if (!OK(qpack_model_get_info(m, &mi))) return 1;
  for (int32_t i = 0; i < mi.num_ops; ++i) {
    qpack_op_kind kind;
    if (!OK(qpack_model_op_kind(m, i, &kind))) {
      ++failed;
      continue;
    }
    if (kind == QPACK_OP_LINEAR) {
      qpack_linear* l = NULL;
      if (!OK(qpack_model_linear(m, i, &l))) {
        ++failed;
        continue;
      }
      qpack_linear_info li;
      failed += !OK(run_linear(l, s_in, zp_in, out));
      failed += !OK(unpack_linear(l, out));
      if (OK(qpack_linear_get_info(l, &li)) && li.has_original) {
        failed += !OK(qpack_linear_release_original(l));
        failed += !OK(unpack_linear(l, out));
      }
      qpack_linear_destroy(l);
    } else {
      qpack_conv2d* c = NULL;
      if (!OK(qpack_model_conv2d(m, i, &c))) {
        ++failed;
        continue;
      }
      qpack_conv2d_info ci;
      failed += !OK(run_conv(c, s_in, zp_in, out));
      failed += !OK(unpack_conv(c, out));
      if (OK(qpack_conv2d_get_info(c, &ci)) && ci.has_original) {
        failed += !OK(qpack_conv2d_release_original(c));
        failed += !OK(unpack_conv(c, out));
      }
      qpack_conv2d_destroy(c);
    }
  }
  for (int32_t i = 0; i < mi.num_data; ++i) {
    const void* d = NULL;
    size_t n = 0;
    uint64_t offset = 0;
    if (!OK(qpack_model_data(m, i, &d, &n, &offset)) || offset % 64 != 0 || offset + n > mi.file_size) {
      ++failed;
      continue;
    }
    put_bytes(out, d, n);
  }
  for (int32_t i = 0; i < mi.num_graphs; ++i) {
    qpack_graph* g = NULL;
    if (!OK(qpack_model_graph(m, i, &g))) {
      ++failed;
      continue;
    }
    failed += !OK(run_graph(g, out));
    qpack_graph_destroy(g);
  }
  return failed;
}

/* ---- op factories --------------------------------------------------------------- */

typedef struct {
  const char* name;
  int64_t ic, oc, groups, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw;
} conv_geom;

static const conv_geom kConvs[] = {
    {"3x3", 8, 16, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
    {"depthwise 3x3", 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},
    {"depthwise 3x3 stride 2", 24, 24, 24, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1},
    {"grouped 3x3 stride 2", 8, 12, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1},
    {"1x1", 16, 8, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1},
    {"3x1 stride 2 dilation 2", 5, 7, 1, 3, 1, 2, 1, 2, 0, 2, 0, 2, 1},
    {"2x2 same (asymmetric pad)", 4, 6, 1, 2, 2, 1, 1, 0, 0, 1, 1, 1, 1},
};

/* Weights and parameters that outlive the create call (the op copies them). */
typedef struct {
  float wf[4096];
  int8_t ws[4096];
  float scales[64], bias[64];
} op_data;

static qpack_status make_linear(qpack_backend backend, qpack_mode mode, int64_t k, int64_t n,
                                float input_scale, op_data* d, uint32_t seed, qpack_linear** out) {
  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = k;
  p.out_features = n;
  p.mode = mode;
  p.backend = backend;
  p.retain = QPACK_RETAIN_KEEP;
  fill_f32(d->bias, (size_t)n, seed + 1, -1.0f, 1.0f);
  p.bias = d->bias;
  if (mode == QPACK_MODE_F32) {
    fill_f32(d->wf, (size_t)(k * n), seed, -1.0f, 1.0f);
    p.weight = d->wf;
    p.clamp_min = -0.75f;
    p.clamp_max = 1.5f;
  } else {
    fill_s8(d->ws, (size_t)(k * n), seed);
    for (int64_t i = 0; i < n; ++i) d->scales[i] = 0.002f + 0.0003f * (float)i;
    p.weight = d->ws;
    p.weight_scales = d->scales;
    p.num_weight_scales = n;
    if (mode == QPACK_MODE_INT8_STATIC) {
      p.input_scale = input_scale;
      p.input_zero_point = input_scale > 0 ? 120 : 0;
      p.output_scale = 0.07f;
      p.output_zero_point = 125;
    }
  }
  *out = NULL;
  return qpack_linear_create(&p, out);
}

static qpack_status make_conv(qpack_backend backend, qpack_mode mode, const conv_geom* g,
                              float input_scale, float output_scale, int32_t output_zp,
                              op_data* d, uint32_t seed, qpack_conv2d** out) {
  qpack_conv2d_params p;
  qpack_conv2d_params_init(&p);
  p.in_channels = g->ic;
  p.out_channels = g->oc;
  p.groups = g->groups;
  p.kernel_h = g->kh;
  p.kernel_w = g->kw;
  p.stride_h = g->sh;
  p.stride_w = g->sw;
  p.pad_top = g->pt;
  p.pad_left = g->pl;
  p.pad_bottom = g->pb;
  p.pad_right = g->pr;
  p.dilation_h = g->dh;
  p.dilation_w = g->dw;
  p.mode = mode;
  p.backend = backend;
  p.retain = QPACK_RETAIN_KEEP;
  const size_t nw = (size_t)(g->oc * (g->ic / g->groups) * g->kh * g->kw);
  fill_f32(d->bias, (size_t)g->oc, seed + 1, -0.5f, 0.5f);
  p.bias = d->bias;
  if (mode == QPACK_MODE_F32) {
    fill_f32(d->wf, nw, seed, -1.0f, 1.0f);
    p.weight = d->wf;
  } else {
    fill_s8(d->ws, nw, seed);
    for (int64_t i = 0; i < g->oc; ++i) d->scales[i] = 0.003f + 0.0002f * (float)i;
    p.weight = d->ws;
    p.weight_scales = d->scales;
    p.num_weight_scales = g->oc;
    p.input_scale = input_scale;
    p.input_zero_point = input_scale > 0 ? 120 : 0;
    p.output_scale = output_scale;
    p.output_zero_point = output_zp;
  }
  *out = NULL;
  return qpack_conv2d_create(&p, out);
}

/* ---- 1. round trips ------------------------------------------------------------- */

static const float kStaticIn = 0.031f; /* the static ops' expected input scale (zp 120) */

static int same_linear_info(const qpack_linear_info* a, const qpack_linear_info* b) {
  return a->in_features == b->in_features && a->out_features == b->out_features &&
         a->mode == b->mode && a->backend == b->backend && a->has_bias == b->has_bias &&
         a->closed == b->closed && a->num_weight_scales == b->num_weight_scales &&
         a->nbytes_packed == b->nbytes_packed;
}
static int same_conv_info(const qpack_conv2d_info* a, const qpack_conv2d_info* b) {
  return a->in_channels == b->in_channels && a->out_channels == b->out_channels &&
         a->groups == b->groups && a->kernel_h == b->kernel_h && a->kernel_w == b->kernel_w &&
         a->mode == b->mode && a->backend == b->backend && a->has_bias == b->has_bias &&
         a->closed == b->closed && a->num_weight_scales == b->num_weight_scales &&
         a->nbytes_packed == b->nbytes_packed;
}

static off_t file_size_of(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

/* The model info of a freshly loaded one-op file. */
static void check_model_info(const char* path, int map, int32_t num_ops, int32_t num_graphs,
                             const char* what) {
  qpack_load_options o;
  qpack_load_options_init(&o);
  o.map = map;
  qpack_model* m = NULL;
  qpack_model_info mi;
  EXPECT(OK(qpack_model_load(path, &o, &m)) && m != NULL, "%s: model load", what);
  if (m == NULL) return;
  EXPECT(OK(qpack_model_get_info(m, &mi)), "%s: model info", what);
  EXPECT(mi.num_ops == num_ops && mi.num_graphs == num_graphs && mi.num_repacked == 0 &&
             mi.mapped == map && (off_t)mi.file_size == file_size_of(path) &&
             mi.nbytes_in_place > 0 && mi.host_size == 0,
         "%s (map=%d): model info ops %d graphs %d repacked %d mapped %d size %zu in place %zu",
         what, map, mi.num_ops, mi.num_graphs, mi.num_repacked, mi.mapped, mi.file_size,
         mi.nbytes_in_place);
  qpack_model_destroy(m);
}

static int g_round_trips = 0;

static void round_trip_linear(const backend_t* b, qpack_mode mode, float input_scale) {
  char what[160], path[600], path_orig[600];
  const double t0 = now_s();
  snprintf(what, sizeof what, "linear %s %s input_scale %g", b->name, mode_name(mode), input_scale);
  static op_data d;
  const int64_t k = 37, n = 21;
  qpack_linear* src = NULL;
  qpack_status st = make_linear(b->id, mode, k, n, input_scale, &d, 101, &src);
  if (st == QPACK_STATUS_UNSUPPORTED) {
    printf("skip %s: %s\n", what, qpack_last_error());
    return;
  }
  EXPECT(st == QPACK_STATUS_SUCCESS, "%s: create", what);
  if (st != QPACK_STATUS_SUCCESS) return;
  qpack_linear_info src_info, info;
  EXPECT(OK(qpack_linear_get_info(src, &src_info)), "%s: info", what);
  path_in(path, sizeof path, "linear.qpk");
  path_in(path_orig, sizeof path_orig, "linear-orig.qpk");
  EXPECT(OK(qpack_linear_save(src, path)), "%s: save", what);
  const qpack_linear* one[1] = {src};
  qpack_save_params sp;
  memset(&sp, 0, sizeof sp);
  sp.num_linears = 1;
  sp.linears = one;
  sp.with_originals = 1;
  EXPECT(OK(qpack_model_save(&sp, path_orig)), "%s: save with originals", what);
  EXPECT(file_size_of(path_orig) > file_size_of(path), "%s: the original takes room", what);

  bytes_t ref = {0}, ref_w = {0};
  EXPECT(OK(run_linear(src, kStaticIn, 120, &ref)), "%s: run", what);
  EXPECT(OK(unpack_linear(src, &ref_w)), "%s: unpack", what);
  EXPECT(ref_w.n >= (size_t)(k * n) &&
             memcmp(ref_w.p, mode == QPACK_MODE_F32 ? (const void*)d.wf : (const void*)d.ws,
                    (size_t)(k * n) * (mode == QPACK_MODE_F32 ? 4 : 1)) == 0,
         "%s: unpack of the source equals its weights", what);

  for (int f = 0; f < 2; ++f) {
    for (int map = 1; map >= 0; --map) {
      qpack_load_options o;
      qpack_load_options_init(&o);
      o.map = map;
      qpack_linear* l = NULL;
      const char* p = f ? path_orig : path;
      EXPECT(OK(qpack_linear_load(p, &o, &l)) && l != NULL, "%s: load (map=%d, originals=%d)", what,
             map, f);
      if (l == NULL) continue;
      EXPECT(OK(qpack_linear_get_info(l, &info)) && same_linear_info(&info, &src_info) &&
                 info.has_original == f,
             "%s (map=%d, originals=%d): info equal (packed %zu vs %zu, original %d)", what, map, f,
             info.nbytes_packed, src_info.nbytes_packed, info.has_original);
      bytes_t y = {0}, w = {0}, w2 = {0};
      EXPECT(OK(run_linear(l, kStaticIn, 120, &y)) && same_bytes(&y, &ref),
             "%s (map=%d, originals=%d): outputs bit-identical", what, map, f);
      EXPECT(OK(unpack_linear(l, &w)) && same_bytes(&w, &ref_w),
             "%s (map=%d, originals=%d): unpack bit-exact", what, map, f);
      EXPECT(OK(qpack_linear_release_original(l)), "%s: release", what);
      EXPECT(OK(unpack_linear(l, &w2)) && same_bytes(&w2, &ref_w),
             "%s (map=%d, originals=%d): unpack bit-exact after release_original", what, map, f);
      y.n = 0;
      EXPECT(OK(run_linear(l, kStaticIn, 120, &y)) && same_bytes(&y, &ref),
             "%s (map=%d, originals=%d): outputs after release", what, map, f);
      /* The loaded op saves again to the same bytes' meaning. */
      char again[600];
      path_in(again, sizeof again, "linear-again.qpk");
      qpack_linear* l2 = NULL;
      EXPECT(OK(qpack_linear_save(l, again)) && OK(qpack_linear_load(again, &o, &l2)),
             "%s: save a loaded op again", what);
      y.n = 0;
      EXPECT(l2 != NULL && OK(run_linear(l2, kStaticIn, 120, &y)) && same_bytes(&y, &ref),
             "%s (map=%d): outputs after a second round trip", what, map);
      qpack_linear_destroy(l2);
      free(y.p);
      free(w.p);
      free(w2.p);
      qpack_linear_destroy(l);
      ++g_round_trips;
    }
  }
  check_model_info(path, 1, 1, 0, what);
  check_model_info(path_orig, 0, 1, 0, what);
  free(ref.p);
  free(ref_w.p);
  qpack_linear_destroy(src);
  trace("%s: %.2f s", what, now_s() - t0);
}

static void round_trip_conv(const backend_t* b, qpack_mode mode, const conv_geom* g,
                            float input_scale) {
  char what[200], path[600], path_orig[600];
  const double t0 = now_s();
  snprintf(what, sizeof what, "conv2d %s %s %s input_scale %g", g->name, b->name, mode_name(mode),
           input_scale);
  static op_data d;
  qpack_conv2d* src = NULL;
  qpack_status st = make_conv(b->id, mode, g, input_scale, 0.09f, 131, &d, 202, &src);
  if (st == QPACK_STATUS_UNSUPPORTED) {
    printf("skip %s: %s\n", what, qpack_last_error());
    return;
  }
  EXPECT(st == QPACK_STATUS_SUCCESS, "%s: create", what);
  if (st != QPACK_STATUS_SUCCESS) return;
  qpack_conv2d_info src_info, info;
  EXPECT(OK(qpack_conv2d_get_info(src, &src_info)), "%s: info", what);
  path_in(path, sizeof path, "conv.qpk");
  path_in(path_orig, sizeof path_orig, "conv-orig.qpk");
  EXPECT(OK(qpack_conv2d_save(src, path)), "%s: save", what);
  const qpack_conv2d* one[1] = {src};
  qpack_save_params sp;
  memset(&sp, 0, sizeof sp);
  sp.num_convs = 1;
  sp.convs = one;
  sp.with_originals = 1;
  EXPECT(OK(qpack_model_save(&sp, path_orig)), "%s: save with originals", what);

  const size_t nw = (size_t)(g->oc * (g->ic / g->groups) * g->kh * g->kw);
  bytes_t ref = {0}, ref_w = {0};
  EXPECT(OK(run_conv(src, kStaticIn, 120, &ref)), "%s: run", what);
  EXPECT(OK(unpack_conv(src, &ref_w)), "%s: unpack", what);
  EXPECT(ref_w.n >= nw &&
             memcmp(ref_w.p, mode == QPACK_MODE_F32 ? (const void*)d.wf : (const void*)d.ws,
                    nw * (mode == QPACK_MODE_F32 ? 4 : 1)) == 0,
         "%s: unpack of the source equals its weights", what);

  for (int f = 0; f < 2; ++f) {
    for (int map = 1; map >= 0; --map) {
      qpack_load_options o;
      qpack_load_options_init(&o);
      o.map = map;
      qpack_conv2d* c = NULL;
      const char* p = f ? path_orig : path;
      EXPECT(OK(qpack_conv2d_load(p, &o, &c)) && c != NULL, "%s: load (map=%d, originals=%d)", what,
             map, f);
      if (c == NULL) continue;
      EXPECT(OK(qpack_conv2d_get_info(c, &info)) && same_conv_info(&info, &src_info) &&
                 info.has_original == f,
             "%s (map=%d, originals=%d): info equal (packed %zu vs %zu, original %d)", what, map, f,
             info.nbytes_packed, src_info.nbytes_packed, info.has_original);
      bytes_t y = {0}, w = {0}, w2 = {0};
      EXPECT(OK(run_conv(c, kStaticIn, 120, &y)) && same_bytes(&y, &ref),
             "%s (map=%d, originals=%d): outputs bit-identical", what, map, f);
      EXPECT(OK(unpack_conv(c, &w)) && same_bytes(&w, &ref_w),
             "%s (map=%d, originals=%d): unpack bit-exact", what, map, f);
      EXPECT(OK(qpack_conv2d_release_original(c)), "%s: release", what);
      EXPECT(OK(unpack_conv(c, &w2)) && same_bytes(&w2, &ref_w),
             "%s (map=%d, originals=%d): unpack bit-exact after release_original", what, map, f);
      y.n = 0;
      EXPECT(OK(run_conv(c, kStaticIn, 120, &y)) && same_bytes(&y, &ref),
             "%s (map=%d, originals=%d): outputs after release", what, map, f);
      char again[600];
      path_in(again, sizeof again, "conv-again.qpk");
      qpack_conv2d* c2 = NULL;
      EXPECT(OK(qpack_conv2d_save(c, again)) && OK(qpack_conv2d_load(again, &o, &c2)),
             "%s: save a loaded op again", what);
      y.n = 0;
      EXPECT(c2 != NULL && OK(run_conv(c2, kStaticIn, 120, &y)) && same_bytes(&y, &ref),
             "%s (map=%d): outputs after a second round trip", what, map);
      qpack_conv2d_destroy(c2);
      free(y.p);
      free(w.p);
      free(w2.p);
      qpack_conv2d_destroy(c);
      ++g_round_trips;
    }
  }
  check_model_info(path, 1, 1, 0, what);
  check_model_info(path_orig, 0, 1, 0, what);
  free(ref.p);
  free(ref_w.p);
  qpack_conv2d_destroy(src);
  trace("%s: %.2f s", what, now_s() - t0);
}

static void test_round_trips(void) {
  for (int i = 0; i < g_num_backends; ++i) {
    const backend_t* b = &g_backends[i];
    for (int mode = QPACK_MODE_F32; mode <= QPACK_MODE_INT8_DYNAMIC; ++mode) {
      if ((b->linear_modes >> mode) & 1u) {
        round_trip_linear(b, (qpack_mode)mode, kStaticIn);
        if (mode == QPACK_MODE_INT8_STATIC) round_trip_linear(b, (qpack_mode)mode, 0.0f);
      }
      if ((b->conv2d_modes >> mode) & 1u) {
        for (size_t g = 0; g < sizeof kConvs / sizeof kConvs[0]; ++g) {
          round_trip_conv(b, (qpack_mode)mode, &kConvs[g], kStaticIn);
          if (mode == QPACK_MODE_INT8_STATIC && g == 0) round_trip_conv(b, (qpack_mode)mode, &kConvs[g], 0.0f);
        }
      }
    }
  }
  printf("round trips: %d loads compared\n", g_round_trips);
}

/* ---- graphs: conv -> relu -> global avgpool -> linear ------------------------------ */

/* f32: x -> conv -> relu -> gap -> linear. u8: x -> quantize -> conv -> relu ->
 * gap -> linear -> dequantize (static int8 convolution and linear). The ops'
 * handles are destroyed: the graph holds them. */
static qpack_graph* make_graph(qpack_backend backend, int u8) {
  static op_data dc, dl;
  static const conv_geom cg = {"graph conv", G_C, 8, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
  const float s_x = 0.0125f, s_conv = 0.04f, s_lin = 0.05f;
  qpack_conv2d* conv = NULL;
  qpack_linear* lin = NULL;
  qpack_status st;
  if (u8) {
    st = make_conv(backend, QPACK_MODE_INT8_STATIC, &cg, s_x, s_conv, 5, &dc, 303, &conv);
    if (st == QPACK_STATUS_SUCCESS) {
      qpack_linear_params p;
      qpack_linear_params_init(&p);
      fill_s8(dl.ws, 8 * 5, 404);
      for (int i = 0; i < 5; ++i) dl.scales[i] = 0.01f + 0.001f * (float)i;
      fill_f32(dl.bias, 5, 405, -0.5f, 0.5f);
      p.in_features = 8;
      p.out_features = 5;
      p.mode = QPACK_MODE_INT8_STATIC;
      p.backend = backend;
      p.weight = dl.ws;
      p.weight_scales = dl.scales;
      p.num_weight_scales = 5;
      p.bias = dl.bias;
      p.input_scale = s_conv;
      p.input_zero_point = 5;
      p.output_scale = s_lin;
      p.output_zero_point = 128;
      st = qpack_linear_create(&p, &lin);
    }
  } else {
    st = make_conv(backend, QPACK_MODE_F32, &cg, 0, 0, 0, &dc, 303, &conv);
    if (st == QPACK_STATUS_SUCCESS) st = make_linear(backend, QPACK_MODE_F32, 8, 5, 0, &dl, 404, &lin);
  }
  EXPECT(st == QPACK_STATUS_SUCCESS, "graph ops (%s)", u8 ? "u8" : "f32");
  qpack_graph* g = NULL;
  if (st == QPACK_STATUS_SUCCESS) {
    qpack_graph_value v[7];
    qpack_graph_node nodes[6];
    memset(v, 0, sizeof v);
    memset(nodes, 0, sizeof nodes);
    qpack_node_kind kinds[6];
    int nn = 0, nv;
    if (u8) {
      const qpack_node_kind k[6] = {QPACK_NODE_QUANTIZE, QPACK_NODE_CONV2D, QPACK_NODE_ACTIVATION,
                                    QPACK_NODE_GLOBAL_AVGPOOL, QPACK_NODE_LINEAR,
                                    QPACK_NODE_DEQUANTIZE};
      memcpy(kinds, k, sizeof k);
      nn = 6;
      nv = 7;
      const qpack_graph_value vals[7] = {{QPACK_DTYPE_F32, 0, 0},       {QPACK_DTYPE_U8, s_x, 120},
                                         {QPACK_DTYPE_U8, s_conv, 5},   {QPACK_DTYPE_U8, s_conv, 5},
                                         {QPACK_DTYPE_U8, s_conv, 5},   {QPACK_DTYPE_U8, s_lin, 128},
                                         {QPACK_DTYPE_F32, 0, 0}};
      memcpy(v, vals, sizeof vals);
    } else {
      const qpack_node_kind k[4] = {QPACK_NODE_CONV2D, QPACK_NODE_ACTIVATION,
                                    QPACK_NODE_GLOBAL_AVGPOOL, QPACK_NODE_LINEAR};
      memcpy(kinds, k, sizeof k);
      nn = 4;
      nv = 5;
    }
    for (int i = 0; i < nn; ++i) {
      nodes[i].kind = kinds[i];
      nodes[i].inputs[0] = i;
      nodes[i].num_inputs = 1;
      nodes[i].output = i + 1;
      if (kinds[i] == QPACK_NODE_CONV2D) nodes[i].conv = conv;
      if (kinds[i] == QPACK_NODE_LINEAR) nodes[i].linear = lin;
      if (kinds[i] == QPACK_NODE_ACTIVATION) nodes[i].activation = QPACK_ACT_RELU;
    }
    int32_t in_v = 0, out_v = nv - 1;
    qpack_graph_params gp = {nv, v, nn, nodes, 1, &in_v, 1, &out_v};
    EXPECT(OK(qpack_graph_create(&gp, &g)), "graph create (%s)", u8 ? "u8" : "f32");
  }
  qpack_conv2d_destroy(conv);
  qpack_linear_destroy(lin);
  return g;
}

static void round_trip_graph(const backend_t* b, int u8) {
  char what[120], path[600], path2[600];
  snprintf(what, sizeof what, "graph %s %s", b->name, u8 ? "u8" : "f32");
  qpack_graph* g = make_graph(b->id, u8);
  if (g == NULL) return;
  bytes_t ref = {0};
  EXPECT(OK(run_graph(g, &ref)), "%s: run", what);
  qpack_graph_info gi, li;
  EXPECT(OK(qpack_graph_get_info(g, &gi)), "%s: info", what);
  path_in(path, sizeof path, "graph.qpk");
  EXPECT(OK(qpack_graph_save(g, path)), "%s: save", what);
  for (int map = 1; map >= 0; --map) {
    qpack_load_options o;
    qpack_load_options_init(&o);
    o.map = map;
    qpack_graph* h = NULL;
    EXPECT(OK(qpack_graph_load(path, &o, &h)) && h != NULL, "%s: load (map=%d)", what, map);
    if (h == NULL) continue;
    bytes_t y = {0};
    EXPECT(OK(run_graph(h, &y)) && same_bytes(&y, &ref), "%s (map=%d): outputs bit-identical",
           what, map);
    EXPECT(OK(qpack_graph_get_info(h, &li)) && li.num_values == gi.num_values &&
               li.num_nodes == gi.num_nodes && li.num_inputs == gi.num_inputs &&
               li.num_outputs == gi.num_outputs && li.nbytes_packed == gi.nbytes_packed &&
               li.runs == 1 && !li.closed,
           "%s (map=%d): info equal (packed %zu vs %zu)", what, map, li.nbytes_packed,
           gi.nbytes_packed);
    free(y.p);
    qpack_graph_destroy(h);
  }
  check_model_info(path, 1, 2, 1, what);

  /* The model's view: op 0 the conv (first in the graph), op 1 the linear;
   * the graph's ops and the handles over them are the same ops. */
  qpack_model* m = NULL;
  EXPECT(OK(qpack_model_load(path, NULL, &m)), "%s: model load", what);
  if (m != NULL) {
    qpack_op_kind k0, k1;
    EXPECT(OK(qpack_model_op_kind(m, 0, &k0)) && k0 == QPACK_OP_CONV2D &&
               OK(qpack_model_op_kind(m, 1, &k1)) && k1 == QPACK_OP_LINEAR,
           "%s: op kinds in graph order", what);
    qpack_linear* lin = NULL;
    qpack_graph* h = NULL;
    EXPECT(OK(qpack_model_linear(m, 1, &lin)) && OK(qpack_model_graph(m, 0, &h)),
           "%s: handles", what);
    /* The model can go: handles keep the file's bytes alive. */
    qpack_model_destroy(m);
    bytes_t y = {0};
    EXPECT(h != NULL && OK(run_graph(h, &y)) && same_bytes(&y, &ref),
           "%s: graph runs after its model is destroyed", what);
    EXPECT(lin != NULL && OK(qpack_linear_close(lin)), "%s: close a loaded linear", what);
    y.n = 0;
    EXPECT(h != NULL && OK(run_graph(h, &y)) && same_bytes(&y, &ref),
           "%s: closing a loaded op's handle leaves the graph running", what);
    qpack_linear_destroy(lin);
    qpack_graph_destroy(h);
    free(y.p);
  }

  /* Saved with one of its ops listed first: that op is op 0 and is stored once. */
  qpack_model* m2 = NULL;
  qpack_linear* lin = NULL;
  path_in(path2, sizeof path2, "graph2.qpk");
  EXPECT(OK(qpack_model_load(path, NULL, &m2)) && OK(qpack_model_linear(m2, 1, &lin)),
         "%s: reload", what);
  qpack_model_destroy(m2);
  if (lin != NULL) {
    const qpack_linear* ls[1] = {lin};
    const qpack_graph* gs[1] = {g};
    qpack_save_params sp;
    memset(&sp, 0, sizeof sp);
    sp.num_linears = 1;
    sp.linears = ls;
    sp.num_graphs = 1;
    sp.graphs = gs;
    /* lin is the loaded copy, not the graph's op: three ops. Then the graph's own. */
    EXPECT(OK(qpack_model_save(&sp, path2)), "%s: save linear + graph", what);
    qpack_model* m3 = NULL;
    qpack_model_info mi;
    EXPECT(OK(qpack_model_load(path2, NULL, &m3)) && OK(qpack_model_get_info(m3, &mi)) &&
               mi.num_ops == 3 && mi.num_graphs == 1,
           "%s: a loaded op is another op than the graph's", what);
    qpack_model_destroy(m3);
    qpack_linear_destroy(lin);
  }
  free(ref.p);
  qpack_graph_destroy(g);
}

static void test_graphs(void) {
  for (int i = 0; i < g_num_backends; ++i) {
    const backend_t* b = &g_backends[i];
    if (((b->linear_modes & b->conv2d_modes) >> QPACK_MODE_F32) & 1u) round_trip_graph(b, 0);
    if (((b->linear_modes & b->conv2d_modes) >> QPACK_MODE_INT8_STATIC) & 1u) round_trip_graph(b, 1);
  }
}

/* ---- accessors and bad arguments ------------------------------------------------- */

static void test_accessors(void) {
  const backend_t* b = g_num_backends > 0 ? &g_backends[0] : NULL;
  if (b == NULL) return;
  static op_data d;
  const qpack_mode mode = (b->linear_modes & 1u) ? QPACK_MODE_F32 : QPACK_MODE_INT8_STATIC;
  const qpack_mode cmode = (b->conv2d_modes & 1u) ? QPACK_MODE_F32 : QPACK_MODE_INT8_STATIC;
  qpack_linear* lin = NULL;
  qpack_conv2d* conv = NULL;
  EXPECT(OK(make_linear(b->id, mode, 6, 4, kStaticIn, &d, 1, &lin)), "accessors: linear");
  EXPECT(OK(make_conv(b->id, cmode, &kConvs[0], kStaticIn, 0.1f, 100, &d, 2, &conv)),
         "accessors: conv");
  if (lin == NULL || conv == NULL) {
    qpack_linear_destroy(lin);
    qpack_conv2d_destroy(conv);
    return;
  }
  char path[600], junk[600];
  path_in(path, sizeof path, "two.qpk");
  path_in(junk, sizeof junk, "never.qpk");
  const char host[] = "host bytes: opaque to the core\0with a NUL inside";
  const qpack_linear* ls[2] = {lin, lin};
  const qpack_conv2d* cs[1] = {conv};
  qpack_save_params sp;
  memset(&sp, 0, sizeof sp);
  sp.num_linears = 1;
  sp.linears = ls;
  sp.num_convs = 1;
  sp.convs = cs;
  sp.host_data = host;
  sp.host_size = sizeof host;
  static uint8_t blob0[100], blob1[5000];
  fill_u8(blob0, sizeof blob0, 5);
  fill_u8(blob1, sizeof blob1, 6);
  const void* blobs[3] = {blob0, NULL, blob1};
  const size_t blob_sizes[3] = {sizeof blob0, 0, sizeof blob1};
  sp.num_data = 3;
  sp.data = blobs;
  sp.data_sizes = blob_sizes;
  EXPECT(OK(qpack_model_save(&sp, path)), "accessors: save");

  /* save: bad arguments */
  EXPECT(qpack_model_save(NULL, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save NULL params");
  EXPECT(qpack_model_save(&sp, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "save NULL path");
  EXPECT(qpack_model_save(&sp, "") == QPACK_STATUS_INVALID_ARGUMENT, "save empty path");
  qpack_save_params bad = sp;
  bad.num_linears = -1;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save negative count");
  bad = sp;
  bad.linears = NULL;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save count without array");
  bad = sp;
  bad.num_graphs = 1;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save graphs NULL");
  bad = sp;
  bad.host_data = NULL;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save host NULL");
  bad = sp;
  bad.num_data = -1;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save negative data count");
  bad = sp;
  bad.data = NULL;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save data NULL");
  bad = sp;
  bad.data_sizes = NULL;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save data_sizes NULL");
  const void* null_blob[1] = {NULL};
  const size_t one_size[1] = {8};
  bad = sp;
  bad.num_data = 1;
  bad.data = null_blob;
  bad.data_sizes = one_size;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save a NULL data blob");
  bad = sp;
  bad.num_linears = 2; /* the same op twice */
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save an op twice");
  const qpack_linear* null_lin[1] = {NULL};
  bad = sp;
  bad.linears = null_lin;
  EXPECT(qpack_model_save(&bad, junk) == QPACK_STATUS_INVALID_ARGUMENT, "save a NULL handle");
  EXPECT(qpack_linear_save(NULL, junk) == QPACK_STATUS_INVALID_ARGUMENT, "linear_save NULL");
  EXPECT(qpack_conv2d_save(NULL, junk) == QPACK_STATUS_INVALID_ARGUMENT, "conv2d_save NULL");
  EXPECT(qpack_graph_save(NULL, junk) == QPACK_STATUS_INVALID_ARGUMENT, "graph_save NULL");
  EXPECT(file_size_of(junk) < 0, "no file after failed saves");
  EXPECT(count_entries(".tmp-") == 0, "no temporary files after failed saves");

  /* load: bad arguments */
  qpack_model* m = (qpack_model*)&d; /* must be reset to NULL on failure */
  EXPECT(qpack_model_load(NULL, NULL, &m) == QPACK_STATUS_INVALID_ARGUMENT && m == NULL,
         "load NULL path");
  EXPECT(qpack_model_load("", NULL, &m) == QPACK_STATUS_INVALID_ARGUMENT, "load empty path");
  EXPECT(qpack_model_load(path, NULL, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "load NULL out");
  EXPECT(qpack_linear_load(path, NULL, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "linear_load NULL");
  qpack_linear* l = NULL;
  qpack_conv2d* c = NULL;
  qpack_graph* g = NULL;
  EXPECT(qpack_linear_load(path, NULL, &l) == QPACK_STATUS_INVALID_ARGUMENT && l == NULL &&
             strstr(qpack_last_error(), "qpack_model_load") != NULL,
         "linear_load of a two-op file");
  EXPECT(qpack_conv2d_load(path, NULL, &c) == QPACK_STATUS_INVALID_ARGUMENT && c == NULL,
         "conv2d_load of a two-op file");
  EXPECT(qpack_graph_load(path, NULL, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL,
         "graph_load of a file without graphs");
  char lpath[600];
  path_in(lpath, sizeof lpath, "one-linear.qpk");
  EXPECT(OK(qpack_linear_save(lin, lpath)), "save one linear");
  EXPECT(qpack_conv2d_load(lpath, NULL, &c) == QPACK_STATUS_INVALID_ARGUMENT && c == NULL,
         "conv2d_load of a linear file");
  EXPECT(OK(qpack_linear_load(lpath, NULL, &l)) && l != NULL, "linear_load of a linear file");
  qpack_linear_destroy(l);
  l = NULL;

  m = NULL;
  EXPECT(OK(qpack_model_load(path, NULL, &m)) && m != NULL, "accessors: load");
  if (m != NULL) {
    qpack_model_info mi;
    qpack_op_kind kind;
    EXPECT(OK(qpack_model_get_info(m, &mi)) && mi.num_ops == 2 && mi.num_graphs == 0 &&
               mi.host_size == sizeof host && mi.mapped == 1 && mi.num_data == 3,
           "accessors: info");
    size_t fsize = 0;
    uint8_t* fbytes = read_file(path, &fsize);
    for (int32_t i = 0; i < 3; ++i) {
      const void* dd = NULL;
      size_t dn = 1;
      uint64_t doff = 1;
      EXPECT(OK(qpack_model_data(m, i, &dd, &dn, &doff)) && dn == blob_sizes[i] && doff % 64 == 0 &&
                 doff + dn <= fsize && (dn == 0 || (memcmp(dd, blobs[i], dn) == 0 &&
                                                    memcmp(fbytes + doff, blobs[i], dn) == 0)),
             "data %d: %zu bytes at offset %llu", i, dn, (unsigned long long)doff);
    }
    free(fbytes);
    const void* dd = NULL;
    size_t dn = 0;
    uint64_t doff = 0;
    EXPECT(qpack_model_data(m, 3, &dd, &dn, &doff) == QPACK_STATUS_INVALID_ARGUMENT, "data index past the end");
    EXPECT(qpack_model_data(m, -1, &dd, &dn, &doff) == QPACK_STATUS_INVALID_ARGUMENT, "data index -1");
    EXPECT(qpack_model_data(NULL, 0, &dd, &dn, &doff) == QPACK_STATUS_INVALID_ARGUMENT, "data NULL model");
    EXPECT(qpack_model_data(m, 0, NULL, &dn, &doff) == QPACK_STATUS_INVALID_ARGUMENT, "data NULL data");
    EXPECT(qpack_model_data(m, 0, &dd, NULL, &doff) == QPACK_STATUS_INVALID_ARGUMENT, "data NULL size");
    EXPECT(qpack_model_data(m, 0, &dd, &dn, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "data NULL offset");
    EXPECT(qpack_model_get_info(NULL, &mi) == QPACK_STATUS_INVALID_ARGUMENT, "info NULL model");
    EXPECT(qpack_model_get_info(m, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "info NULL out");
    EXPECT(OK(qpack_model_op_kind(m, 0, &kind)) && kind == QPACK_OP_LINEAR, "op 0 is the linear");
    EXPECT(OK(qpack_model_op_kind(m, 1, &kind)) && kind == QPACK_OP_CONV2D, "op 1 is the conv");
    EXPECT(qpack_model_op_kind(NULL, 0, &kind) == QPACK_STATUS_INVALID_ARGUMENT, "kind NULL model");
    EXPECT(qpack_model_op_kind(m, 0, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "kind NULL out");
    EXPECT(qpack_model_op_kind(m, -1, &kind) == QPACK_STATUS_INVALID_ARGUMENT, "kind index -1");
    EXPECT(qpack_model_op_kind(m, 2, &kind) == QPACK_STATUS_INVALID_ARGUMENT &&
               strstr(qpack_last_error(), "out of range") != NULL,
           "kind index past the end");
    EXPECT(qpack_model_op_kind(m, INT32_MAX, &kind) == QPACK_STATUS_INVALID_ARGUMENT, "kind INT32_MAX");
    EXPECT(qpack_model_op_kind(m, INT32_MIN, &kind) == QPACK_STATUS_INVALID_ARGUMENT, "kind INT32_MIN");

    l = (qpack_linear*)&d;
    EXPECT(qpack_model_linear(m, 1, &l) == QPACK_STATUS_INVALID_ARGUMENT && l == NULL,
           "linear of a conv op");
    EXPECT(qpack_model_linear(m, 2, &l) == QPACK_STATUS_INVALID_ARGUMENT && l == NULL,
           "linear index past the end");
    EXPECT(qpack_model_linear(m, -1, &l) == QPACK_STATUS_INVALID_ARGUMENT, "linear index -1");
    EXPECT(qpack_model_linear(NULL, 0, &l) == QPACK_STATUS_INVALID_ARGUMENT, "linear NULL model");
    EXPECT(qpack_model_linear(m, 0, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "linear NULL out");
    c = (qpack_conv2d*)&d;
    EXPECT(qpack_model_conv2d(m, 0, &c) == QPACK_STATUS_INVALID_ARGUMENT && c == NULL,
           "conv of a linear op");
    EXPECT(qpack_model_conv2d(m, 2, &c) == QPACK_STATUS_INVALID_ARGUMENT, "conv index past the end");
    EXPECT(qpack_model_conv2d(m, -7, &c) == QPACK_STATUS_INVALID_ARGUMENT, "conv index -7");
    EXPECT(qpack_model_conv2d(NULL, 1, &c) == QPACK_STATUS_INVALID_ARGUMENT, "conv NULL model");
    EXPECT(qpack_model_conv2d(m, 1, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "conv NULL out");
    g = (qpack_graph*)&d;
    EXPECT(qpack_model_graph(m, 0, &g) == QPACK_STATUS_INVALID_ARGUMENT && g == NULL,
           "graph index 0 of a file without graphs");
    EXPECT(qpack_model_graph(m, -1, &g) == QPACK_STATUS_INVALID_ARGUMENT, "graph index -1");
    EXPECT(qpack_model_graph(NULL, 0, &g) == QPACK_STATUS_INVALID_ARGUMENT, "graph NULL model");
    EXPECT(qpack_model_graph(m, 0, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "graph NULL out");

    const void* hd = NULL;
    size_t hs = 0;
    EXPECT(OK(qpack_model_host(m, &hd, &hs)) && hs == sizeof host && hd != NULL &&
               memcmp(hd, host, sizeof host) == 0,
           "host bytes");
    EXPECT(qpack_model_host(NULL, &hd, &hs) == QPACK_STATUS_INVALID_ARGUMENT, "host NULL model");
    EXPECT(qpack_model_host(m, NULL, &hs) == QPACK_STATUS_INVALID_ARGUMENT, "host NULL data");
    EXPECT(qpack_model_host(m, &hd, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "host NULL size");

    char buf[64];
    EXPECT(qpack_model_repacked(m, 0, buf, sizeof buf) == QPACK_STATUS_INVALID_ARGUMENT,
           "repacked index 0 when nothing was re-packed");
    EXPECT(qpack_model_repacked(m, -1, buf, sizeof buf) == QPACK_STATUS_INVALID_ARGUMENT,
           "repacked index -1");
    EXPECT(qpack_model_repacked(m, 0, NULL, 8) == QPACK_STATUS_INVALID_ARGUMENT, "repacked NULL buf");
    EXPECT(qpack_model_repacked(m, 0, buf, 0) == QPACK_STATUS_INVALID_ARGUMENT, "repacked size 0");
    EXPECT(qpack_model_repacked(NULL, 0, buf, sizeof buf) == QPACK_STATUS_INVALID_ARGUMENT,
           "repacked NULL model");

    /* Handles outlive the model and the host bytes go with the model. */
    qpack_linear* l0 = NULL;
    qpack_conv2d* c1 = NULL;
    EXPECT(OK(qpack_model_linear(m, 0, &l0)) && OK(qpack_model_conv2d(m, 1, &c1)), "handles");
    qpack_model_destroy(m);
    bytes_t a = {0}, b2 = {0};
    EXPECT(l0 != NULL && OK(run_linear(l0, kStaticIn, 120, &a)) && OK(run_linear(lin, kStaticIn, 120, &b2)) &&
               same_bytes(&a, &b2),
           "a linear handle runs after its model is destroyed");
    a.n = b2.n = 0;
    EXPECT(c1 != NULL && OK(run_conv(c1, kStaticIn, 120, &a)) && OK(run_conv(conv, kStaticIn, 120, &b2)) &&
               same_bytes(&a, &b2),
           "a conv handle runs after its model is destroyed");
    free(a.p);
    free(b2.p);
    qpack_linear_destroy(l0);
    qpack_conv2d_destroy(c1);
  }
  qpack_model_destroy(NULL);

  /* A closed op cannot be saved. */
  EXPECT(OK(qpack_linear_close(lin)), "close");
  EXPECT(qpack_linear_save(lin, junk) == QPACK_STATUS_CLOSED, "save a closed linear");
  EXPECT(file_size_of(junk) < 0 && count_entries(".tmp-") == 0, "nothing left by a refused save");
  qpack_load_options_init(NULL);
  qpack_linear_destroy(lin);
  qpack_conv2d_destroy(conv);
}

/* ---- 2. corruption -------------------------------------------------------------- */

enum { R_HEADER, R_TABLE, R_OP, R_PACKED, R_ORIGINAL, R_GRAPH, R_HOST, R_DATA, R_PAD, R_COUNT };
static const char* kRegion[R_COUNT] = {"header", "table",  "op",   "packed", "original",
                                       "graph",  "host",   "data", "padding"};

typedef struct {
  const char* name;
  char path[600];     /* the pristine file */
  char variant[600];  /* the file loaded for each variant */
  uint8_t* bytes;
  size_t size;
  uint8_t* region;    /* R_* of every byte */
  size_t table_end;
  bytes_t ref;        /* probe_model of the pristine file */
  float s_in;
  int fd;             /* the variant, open for pwrite */
  /* counts */
  unsigned backends;  /* bit (1 << qpack_backend) for each backend of the file's ops */
  qpack_model_info info; /* of the pristine file */
  long flips, flips_format, flips_pad_ok, flips_pad_probed;
  long region_flips[R_COUNT];
  long noverify, noverify_format, noverify_ok, noverify_other;
  long fields, fields_format, fields_ok;
  long resealed, resealed_format, resealed_ok;
  long crafted, crafted_format, crafted_ok;
  long truncated, extended;
  long ran_failed; /* accepted variants whose runs returned an error (not a crash) */
} suite_t;

static uint64_t rd64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static void wr64(uint8_t* p, uint64_t v) { memcpy(p, &v, 8); }

/* Recomputes the table and header checksums of a header + table image. */
static void reseal(uint8_t* b, size_t table_bytes) {
  wr64(b + 232, XXH3_64bits(b + 256, table_bytes));
  wr64(b + 248, XXH3_64bits(b, 248));
}

/* Loads the variant file: the status. On success the model is probed (every
 * run, unpack and graph; *identical: the same bytes as the pristine file's)
 * when `probe`, else only its info is compared with the pristine file's. */
static qpack_status load_variant(suite_t* s, int verify, int map, int probe, int* identical) {
  qpack_load_options o;
  qpack_load_options_init(&o);
  o.verify = verify;
  o.map = map;
  qpack_model* m = (qpack_model*)s; /* must be reset on failure */
  qpack_status st = qpack_model_load(s->variant, &o, &m);
  *identical = 0;
  if (st != QPACK_STATUS_SUCCESS) {
    if (m != NULL) {
      ++failures;
      fprintf(stderr, "FAIL %s: a failed load left model_out set\n", s->name);
    }
    if (st == QPACK_STATUS_FILE_FORMAT && strstr(qpack_last_error(), s->variant) == NULL) {
      ++failures;
      fprintf(stderr, "FAIL %s: FILE_FORMAT message does not name the file: %s\n", s->name,
              qpack_last_error());
    }
    return st;
  }
  if (probe) {
    bytes_t out = {0};
    if (probe_model(m, s->s_in, 120, &out) != 0) ++s->ran_failed;
    *identical = same_bytes(&out, &s->ref);
    free(out.p);
  } else {
    qpack_model_info mi;
    *identical = OK(qpack_model_get_info(m, &mi)) && mi.num_ops == s->info.num_ops &&
                 mi.num_graphs == s->info.num_graphs && mi.num_repacked == 0 &&
                 mi.nbytes_in_place == s->info.nbytes_in_place && mi.host_size == s->info.host_size &&
                 mi.num_data == s->info.num_data;
  }
  qpack_model_destroy(m);
  return st;
}

static int setup_suite(suite_t* s, const char* name, const char* file, float s_in) {
  memset(s, 0, sizeof *s);
  s->name = name;
  s->s_in = s_in;
  path_in(s->path, sizeof s->path, file);
  snprintf(s->variant, sizeof s->variant, "%s.variant", s->path);
  s->bytes = read_file(s->path, &s->size);
  EXPECT(s->bytes != NULL && s->size > 4096, "%s: read the file", name);
  if (s->bytes == NULL) return 0;
  const uint32_t n = rd32(s->bytes + 20);
  s->table_end = 256 + (size_t)n * 32;
  s->region = malloc(s->size);
  memset(s->region, R_PAD, s->size);
  memset(s->region, R_HEADER, 256);
  memset(s->region + 256, R_TABLE, (size_t)n * 32);
  static const int kind_region[7] = {R_PAD, R_OP, R_PACKED, R_ORIGINAL, R_GRAPH, R_HOST, R_DATA};
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* e = s->bytes + 256 + i * 32;
    const uint32_t type = rd32(e);
    const uint64_t off = rd64(e + 8), size = rd64(e + 16);
    EXPECT(type >= 1 && type <= 6 && off + size <= s->size, "%s: section %u", name, i);
    if (type >= 1 && type <= 6 && off + size <= s->size) memset(s->region + off, kind_region[type], size);
  }
  EXPECT(write_file(s->variant, s->bytes, s->size), "%s: variant file", name);
  s->fd = open(s->variant, O_RDWR);
  /* The reference: the pristine file, probed. */
  qpack_model* m = NULL;
  EXPECT(OK(qpack_model_load(s->path, NULL, &m)), "%s: load", name);
  if (m == NULL) return 0;
  EXPECT(probe_model(m, s_in, 120, &s->ref) == 0, "%s: probe the pristine file", name);
  EXPECT(OK(qpack_model_get_info(m, &s->info)), "%s: info", name);
  for (int32_t i = 0; i < s->info.num_ops; ++i) {
    qpack_op_kind kind;
    qpack_linear* l = NULL;
    qpack_conv2d* c = NULL;
    qpack_linear_info li;
    qpack_conv2d_info ci;
    if (!OK(qpack_model_op_kind(m, i, &kind))) continue;
    if (kind == QPACK_OP_LINEAR && OK(qpack_model_linear(m, i, &l)) && OK(qpack_linear_get_info(l, &li))) {
      s->backends |= 1u << li.backend;
    }
    if (kind == QPACK_OP_CONV2D && OK(qpack_model_conv2d(m, i, &c)) && OK(qpack_conv2d_get_info(c, &ci))) {
      s->backends |= 1u << ci.backend;
    }
    qpack_linear_destroy(l);
    qpack_conv2d_destroy(c);
  }
  qpack_model_destroy(m);
  return s->fd >= 0;
}

/* Every byte flipped (xor 0xFF, then one bit), one at a time. With verify:
 * FILE_FORMAT, or for padding a load that runs bit-identical. Without verify
 * (header, table and record bytes; weight and DATA bytes are unverifiable by
 * definition): FILE_FORMAT or a load whose every run completes. */
static void suite_flips(suite_t* s) {
  for (size_t i = 0; i < s->size; ++i) {
    const int r = s->region[i];
    /* Padding: every variant loads; the first and last byte of each stretch
     * and every 64th are also run and compared (the rest: info compared). */
    const int edge = r == R_PAD && (i == 0 || s->region[i - 1] != R_PAD || i + 1 == s->size ||
                                    s->region[i + 1] != R_PAD);
    const int probe = r != R_PAD || edge || i % 64 == 0;
    const uint8_t flips[2] = {0xFF, (uint8_t)(1u << (i % 8))};
    for (int f = 0; f < 2; ++f) {
      const uint8_t v = (uint8_t)(s->bytes[i] ^ flips[f]);
      if (!pwrite_all(s->fd, &v, 1, (off_t)i)) {
        EXPECT(0, "%s: pwrite", s->name);
        return;
      }
      int same = 0;
      trace("%s: byte %zu (%s) ^ 0x%02x, verify 1", s->name, i, kRegion[r], flips[f]);
      const qpack_status st = load_variant(s, 1, (int)((i + f) & 1), probe, &same);
      ++s->flips;
      ++s->region_flips[r];
      if (r == R_PAD) {
        EXPECT(st == QPACK_STATUS_SUCCESS && same,
               "%s: byte %zu (padding) ^ 0x%02x: status %d, identical %d", s->name, i, flips[f], st,
               same);
        s->flips_pad_ok += st == QPACK_STATUS_SUCCESS && same;
        s->flips_pad_probed += probe && st == QPACK_STATUS_SUCCESS && same;
      } else {
        EXPECT(st == QPACK_STATUS_FILE_FORMAT, "%s: byte %zu (%s) ^ 0x%02x with verify: status %d",
               s->name, i, kRegion[r], flips[f], st);
        s->flips_format += st == QPACK_STATUS_FILE_FORMAT;
      }
      if (r != R_PACKED && r != R_ORIGINAL && r != R_DATA && r != R_PAD) {
        trace("%s: byte %zu (%s) ^ 0x%02x, verify 0", s->name, i, kRegion[r], flips[f]);
        const qpack_status st0 = load_variant(s, 0, (int)(i & 1), 1, &same);
        ++s->noverify;
        if (st0 == QPACK_STATUS_FILE_FORMAT) {
          ++s->noverify_format;
        } else if (st0 == QPACK_STATUS_SUCCESS) {
          ++s->noverify_ok;
        } else {
          ++s->noverify_other;
          EXPECT(0, "%s: byte %zu (%s) ^ 0x%02x without verify: status %d (FILE_FORMAT or success)",
                 s->name, i, kRegion[r], flips[f], st0);
        }
      }
    }
    pwrite_all(s->fd, &s->bytes[i], 1, (off_t)i);
  }
}

/* Record fields (4-byte aligned in OP and GRAPH records) set to boundary
 * values, without verify: FILE_FORMAT or a load whose every run completes. */
static void suite_fields(suite_t* s) {
  static const uint32_t v32[] = {0u, 1u, 2u, 3u, 13u, 64u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu,
                                 0xFFFFFFFEu, 0x00100000u, 0x7F800000u /* +inf */,
                                 0x7FC00000u /* nan */, 0xFF800000u /* -inf */, 0x3F800000u /* 1.0 */};
  static const uint64_t v64[] = {0x7FFFFFFFFFFFFFFFull, 0x8000000000000000ull, 1ull << 31,
                                 1ull << 40, 0xFFFFFFFFFFFFFFFFull, 1ull << 32};
  for (size_t i = 0; i + 4 <= s->size; ++i) {
    const int r = s->region[i];
    if ((r != R_OP && r != R_GRAPH) || i % 4 != 0) continue;
    /* Offsets within the section: aligned to the section start (8-aligned). */
    const size_t n32 = sizeof v32 / sizeof v32[0], n64 = sizeof v64 / sizeof v64[0];
    for (size_t k = 0; k < n32 + n64; ++k) {
      uint8_t buf[8];
      size_t w = 4;
      if (k < n32) {
        memcpy(buf, &v32[k], 4);
      } else {
        if (i + 8 > s->size || s->region[i + 7] != r) continue;
        memcpy(buf, &v64[k - n32], 8);
        w = 8;
      }
      if (memcmp(buf, s->bytes + i, w) == 0) continue;
      pwrite_all(s->fd, buf, w, (off_t)i);
      int same = 0;
      trace("%s: %zu-byte field at %zu (%s) = 0x%llx, verify 0", s->name, w, i, kRegion[r],
            (unsigned long long)(w == 4 ? (uint64_t)rd32(buf) : rd64(buf)));
      const qpack_status st = load_variant(s, 0, (int)(k & 1), 1, &same);
      ++s->fields;
      if (st == QPACK_STATUS_FILE_FORMAT) {
        ++s->fields_format;
      } else if (st == QPACK_STATUS_SUCCESS) {
        ++s->fields_ok;
      } else {
        EXPECT(0, "%s: %zu-byte field at %zu (%s) = 0x%llx without verify: status %d", s->name, w, i,
               kRegion[r],
               (unsigned long long)(w == 4 ? (uint64_t)rd32(buf) : rd64(buf)), st);
      }
      pwrite_all(s->fd, s->bytes + i, w, (off_t)i);
    }
  }
}

/* Header and table bytes flipped with fresh table and header checksums, so
 * that the loader's own checks of every field (not the checksums) decide. */
static void suite_resealed(suite_t* s) {
  const size_t te = s->table_end;
  uint8_t* img = malloc(te);
  for (size_t i = 0; i < te; ++i) {
    if (i >= 232 && i < 240) continue; /* the table checksum: resealing rewrites it */
    if (i >= 248 && i < 256) continue; /* the header checksum */
    const uint8_t flips[2] = {0xFF, (uint8_t)(1u << (i % 8))};
    for (int f = 0; f < 2; ++f) {
      memcpy(img, s->bytes, te);
      img[i] ^= flips[f];
      /* The table checksum over the table as the (maybe changed) count gives
       * it; a count past the file keeps the old one (the bounds check decides). */
      const uint64_t n = rd32(img + 20);
      if (n <= (1u << 20) && 256 + n * 32 <= s->size) {
        uint8_t* whole = malloc(256 + n * 32 + 1);
        memcpy(whole, s->bytes, 256 + n * 32);
        memcpy(whole, img, 256 + n * 32 < te ? 256 + n * 32 : te);
        wr64(img + 232, XXH3_64bits(whole + 256, n * 32));
        free(whole);
      }
      wr64(img + 248, XXH3_64bits(img, 248));
      pwrite_all(s->fd, img, te, 0);
      for (int verify = 1; verify >= 0; --verify) {
        int same = 0;
        trace("%s: resealed byte %zu ^ 0x%02x, verify %d", s->name, i, flips[f], verify);
        const qpack_status st = load_variant(s, verify, verify, 1, &same);
        ++s->resealed;
        if (st == QPACK_STATUS_FILE_FORMAT) {
          ++s->resealed_format;
        } else if (st == QPACK_STATUS_SUCCESS) {
          ++s->resealed_ok;
          /* Text fields (versions, builds, ISAs) and the reserved word: a foreign
           * build re-packs to the same outputs; the rest must still run. */
          if (i >= 40 && i < 248) {
            EXPECT(same, "%s: resealed header byte %zu ^ 0x%02x: outputs differ", s->name, i, flips[f]);
          }
        } else {
          EXPECT(0, "%s: resealed %s byte %zu ^ 0x%02x (verify %d): status %d", s->name,
                 i < 256 ? "header" : "table", i, flips[f], verify, st);
        }
      }
    }
  }
  pwrite_all(s->fd, s->bytes, te, 0);
  free(img);
}

/* Truncated at every length (FILE_FORMAT), then at every section boundary with
 * file_size patched to match and resealed (sections outside the file), then
 * extended (with and without file_size patched). */
static void suite_truncate(suite_t* s) {
  for (size_t len = s->size; len-- > 0;) {
    if (ftruncate(s->fd, (off_t)len) != 0) break;
    int same = 0;
    trace("%s: truncated to %zu", s->name, len);
    const qpack_status st = load_variant(s, (int)(len & 1), (int)((len >> 1) & 1), 0, &same);
    ++s->truncated;
    EXPECT(st == QPACK_STATUS_FILE_FORMAT, "%s: truncated to %zu bytes: status %d", s->name, len, st);
  }
  const uint32_t n = rd32(s->bytes + 20);
  uint8_t* img = malloc(s->size + 4096);
  for (uint32_t k = 0; k < n; ++k) {
    const uint8_t* e = s->bytes + 256 + k * 32;
    const uint64_t off = rd64(e + 8), size = rd64(e + 16);
    const uint64_t cuts[4] = {off, off + 1, off + size / 2, off + size - 1};
    for (int c = 0; c < 4; ++c) {
      const size_t len = (size_t)cuts[c];
      if (len < s->table_end || len >= s->size || (c > 0 && cuts[c] == cuts[c - 1])) continue;
      memcpy(img, s->bytes, len);
      wr64(img + 32, len);
      reseal(img, s->table_end - 256);
      for (int verify = 1; verify >= 0; --verify) {
        if (ftruncate(s->fd, 0) != 0 || !pwrite_all(s->fd, img, len, 0)) break;
        int same = 0;
        const qpack_status st = load_variant(s, verify, verify, 0, &same);
        ++s->truncated;
        EXPECT(st == QPACK_STATUS_FILE_FORMAT,
               "%s: cut at %zu (in section %u) with file_size %zu, verify %d: status %d", s->name,
               len, k, len, verify, st);
      }
    }
  }
  /* Longer than file_size: refused. With file_size patched: the sections are intact. */
  const size_t extra[3] = {1, 63, 4096};
  for (int x = 0; x < 3; ++x) {
    memcpy(img, s->bytes, s->size);
    memset(img + s->size, 0, extra[x]);
    for (int patched = 0; patched < 2; ++patched) {
      if (patched) {
        wr64(img + 32, s->size + extra[x]);
        reseal(img, s->table_end - 256);
      }
      if (ftruncate(s->fd, 0) != 0 || !pwrite_all(s->fd, img, s->size + extra[x], 0)) break;
      int same = 0;
      const qpack_status st = load_variant(s, 1, patched, 1, &same);
      ++s->extended;
      if (patched) {
        EXPECT(st == QPACK_STATUS_FILE_FORMAT || (st == QPACK_STATUS_SUCCESS && same),
               "%s: %zu bytes appended, file_size patched: status %d identical %d", s->name,
               extra[x], st, same);
      } else {
        EXPECT(st == QPACK_STATUS_FILE_FORMAT, "%s: %zu bytes appended: status %d", s->name,
               extra[x], st);
      }
    }
  }
  free(img);
  EXPECT(ftruncate(s->fd, 0) == 0 && pwrite_all(s->fd, s->bytes, s->size, 0), "%s: restore", s->name);
}

/* A foreign build: the oneDNN / QNNPACK build identifier changed (and
 * resealed). Loads re-pack every op of that backend to the same outputs and
 * weights; with strict they fail with FILE_FORMAT. A change for a backend
 * that none of the file's ops uses, or of an ISA alone (the layouts decide,
 * and here they are equal), changes nothing. */
static void suite_foreign(suite_t* s) {
  static const struct {
    size_t offset, size;
    qpack_backend backend;
    int build; /* a build identifier: nothing of that backend is used in place; an ISA
                  alone: the layouts decide (equal here: used in place) */
    const char* text;
    const char* what;
  } kFields[] = {
      {56, 64, QPACK_BACKEND_ONEDNN, 1, "onednn 9.9.9 0000000 pack 7", "oneDNN build"},
      {120, 64, QPACK_BACKEND_QNNPACK, 1, "qnnpack pytorch-0.0.0 pack 7", "QNNPACK build"},
      {184, 32, QPACK_BACKEND_ONEDNN, 0, "avx_future", "oneDNN ISA"},
      {216, 16, QPACK_BACKEND_QNNPACK, 0, "riscv-v", "QNNPACK ISA"},
  };
  uint8_t* img = malloc(s->table_end);
  for (int f = 0; f < 4; ++f) {
    /* Without that backend in the writer's build, the field is empty and stays so. */
    if (s->bytes[kFields[f].offset] == 0 && kFields[f].offset < 184) continue;
    const int used = kFields[f].build && ((s->backends >> kFields[f].backend) & 1u);
    memcpy(img, s->bytes, s->table_end);
    memset(img + kFields[f].offset, 0, kFields[f].size);
    memcpy(img + kFields[f].offset, kFields[f].text, strlen(kFields[f].text));
    reseal(img, s->table_end - 256);
    pwrite_all(s->fd, img, s->table_end, 0);
    for (int strict = 0; strict < 2; ++strict) {
      qpack_load_options o;
      qpack_load_options_init(&o);
      o.strict = strict;
      qpack_model* m = NULL;
      trace("%s: %s changed, strict %d", s->name, kFields[f].what, strict);
      const qpack_status st = qpack_model_load(s->variant, &o, &m);
      if (strict && used) {
        EXPECT(st == QPACK_STATUS_FILE_FORMAT && strstr(qpack_last_error(), "strict") != NULL &&
                   m == NULL,
               "%s: %s changed, strict: status %d", s->name, kFields[f].what, st);
        qpack_model_destroy(m);
        continue;
      }
      EXPECT(st == QPACK_STATUS_SUCCESS, "%s: %s changed (strict %d, used %d): status %d", s->name,
             kFields[f].what, strict, used, st);
      if (m == NULL) continue;
      qpack_model_info mi;
      EXPECT(OK(qpack_model_get_info(m, &mi)), "%s: info", s->name);
      if (used) {
        char why[512] = "", small[8];
        EXPECT(mi.num_repacked >= 1 && OK(qpack_model_repacked(m, 0, why, sizeof why)) &&
                   strstr(why, "re-packed") != NULL && strstr(why, kFields[f].text) != NULL,
               "%s: %s changed: re-packed %d: %s", s->name, kFields[f].what, mi.num_repacked, why);
        EXPECT(OK(qpack_model_repacked(m, 0, small, sizeof small)) && strlen(small) == 7,
               "%s: re-packed message truncated to the buffer", s->name);
        EXPECT(qpack_model_repacked(m, mi.num_repacked, why, sizeof why) ==
                   QPACK_STATUS_INVALID_ARGUMENT,
               "%s: re-packed index past the end", s->name);
        EXPECT(mi.nbytes_in_place < s->info.nbytes_in_place, "%s: %s changed: %zu bytes in place",
               s->name, kFields[f].what, mi.nbytes_in_place);
      } else {
        EXPECT(mi.num_repacked == 0 && mi.nbytes_in_place == s->info.nbytes_in_place,
               "%s: %s changed (no op of that backend, or an ISA alone): re-packed %d", s->name,
               kFields[f].what, mi.num_repacked);
      }
      bytes_t out = {0};
      EXPECT(probe_model(m, s->s_in, 120, &out) == 0 && same_bytes(&out, &s->ref),
             "%s: %s changed: the same outputs and weights", s->name, kFields[f].what);
      free(out.p);
      qpack_model_destroy(m);
    }
  }
  pwrite_all(s->fd, s->bytes, s->table_end, 0);
  free(img);
}

/* ---- crafted layouts: an op record rewritten, placed in the padding after
 * the small sections and resealed (its section's, the table's and the
 * header's checksums recomputed), as a hostile file would be. */

static void put32(uint8_t* p, size_t* at, uint32_t v) {
  memcpy(p + *at, &v, 4);
  *at += 4;
}
static void put64(uint8_t* p, size_t* at, uint64_t v) {
  memcpy(p + *at, &v, 8);
  *at += 8;
}

/* The offset of the layout_size field in an OP record (docs/FORMAT.md). */
static size_t layout_field(const uint8_t* rec, size_t size) {
  size_t at = 20;
  const uint32_t ng = rd32(rec + at);
  at += 4 + 8 * (size_t)ng;
  const uint32_t ns = rd32(rec + at);
  at += 4 + 8 * (size_t)ns;
  const uint32_t nb = rd32(rec + at);
  at += 4 + 4 * (size_t)nb + 24;
  return at + 4 <= size ? at : 0;
}

/* Section k replaced by rec[0, n): the variant file written; 0 when it does not fit. */
static int write_crafted(suite_t* s, uint32_t k, const uint8_t* rec, size_t n) {
  size_t end = s->table_end; /* the end of the small sections */
  const uint32_t count = rd32(s->bytes + 20);
  for (uint32_t i = 0; i < count; ++i) {
    const uint8_t* e = s->bytes + 256 + i * 32;
    const uint32_t type = rd32(e);
    if (type == 1 || type == 4 || type == 5) {
      const size_t last = (size_t)(rd64(e + 8) + rd64(e + 16));
      if (last > end) end = last;
    }
  }
  const size_t at = (end + 7) / 8 * 8;
  if (at + n > 4096 || at + n > s->size) return 0;
  uint8_t* img = malloc(s->size);
  memcpy(img, s->bytes, s->size);
  memcpy(img + at, rec, n);
  uint8_t* e = img + 256 + k * 32;
  wr64(e + 8, at);
  wr64(e + 16, n);
  wr64(e + 24, XXH3_64bits(rec, n));
  reseal(img, s->table_end - 256);
  const int ok = pwrite_all(s->fd, img, s->size, 0);
  free(img);
  return ok;
}

static void load_crafted(suite_t* s, uint32_t k, const uint8_t* rec, size_t n, const char* what) {
  if (!write_crafted(s, k, rec, n)) return;
  for (int verify = 1; verify >= 0; --verify) {
    int same = 0;
    trace("%s: crafted op section %u: %s, verify %d", s->name, k, what, verify);
    const qpack_status st = load_variant(s, verify, verify, 1, &same);
    ++s->crafted;
    if (st == QPACK_STATUS_FILE_FORMAT) {
      ++s->crafted_format;
    } else if (st == QPACK_STATUS_SUCCESS) {
      ++s->crafted_ok;
    } else {
      EXPECT(0, "%s: crafted op section %u (%s), verify %d: status %d (FILE_FORMAT or success)",
             s->name, k, what, verify, st);
    }
  }
}

enum { DNNL_TAG = 0x4C4E4E44, QNNP_TAG = 0x504E4E51 };

/* oneDNN layouts: overflowing offsets, aliasing and plain strides, blocks. */
static void craft_onednn(suite_t* s, uint32_t k, const uint8_t* rec, size_t lf) {
  const uint8_t* lay = rec + lf + 4;
  const uint32_t data_type = rd32(lay + 8);
  const int32_t nd = (int32_t)rd32(lay + 16);
  if (nd < 1 || nd > 6) return;
  int64_t dims[6];
  memcpy(dims, lay + 20, 8 * (size_t)nd);
  const size_t nbl_at = 20 + 16 * (size_t)nd;
  const int32_t nbl = (int32_t)rd32(lay + nbl_at);
  const uint64_t size = rd64(lay + nbl_at + 4 + 16 * (size_t)nbl);
  const size_t elem = data_type == 3 ? 4 : 1;
  uint8_t buf[2048];
  for (int c = 0; c < 7; ++c) {
    memcpy(buf, rec, lf);
    size_t at = lf + 4;
    put32(buf, &at, DNNL_TAG);
    put32(buf, &at, 1);
    put32(buf, &at, data_type);
    put32(buf, &at, 0);
    const char* what = "";
    if (c == 0) { /* six dimensions, six blocks of 4096: the inner offset overflows int64 */
      what = "6 blocks of 4096";
      put32(buf, &at, 6);
      for (int d = 0; d < 6; ++d) put64(buf, &at, 1);
      for (int d = 0; d < 6; ++d) put64(buf, &at, 0);
      put32(buf, &at, 6);
      for (int d = 0; d < 6; ++d) put64(buf, &at, 4096);
      for (int d = 0; d < 6; ++d) put64(buf, &at, (uint64_t)d);
    } else if (c == 1) { /* dims 2^31 with strides 2^40: the largest offset overflows */
      what = "dims 2^31, strides 2^40";
      put32(buf, &at, 6);
      for (int d = 0; d < 6; ++d) put64(buf, &at, 1ull << 31);
      for (int d = 0; d < 6; ++d) put64(buf, &at, 1ull << 40);
      put32(buf, &at, 0);
    } else if (c == 2 || c == 3) { /* the op's dims, strides 0 (every element aliases one) or row-major */
      what = c == 2 ? "strides 0" : "row-major strides";
      put32(buf, &at, (uint32_t)nd);
      for (int d = 0; d < nd; ++d) put64(buf, &at, (uint64_t)dims[d]);
      int64_t stride = 1;
      int64_t strides[6];
      for (int d = nd - 1; d >= 0; --d) {
        strides[d] = c == 2 ? 0 : stride;
        stride *= dims[d];
      }
      for (int d = 0; d < nd; ++d) put64(buf, &at, (uint64_t)strides[d]);
      put32(buf, &at, 0);
      if (c == 3 && (uint64_t)stride * elem > size) continue;
    } else if (c == 4) { /* row-major, one byte short of the last element */
      what = "row-major, size one element short";
      put32(buf, &at, (uint32_t)nd);
      int64_t stride = 1, strides[6];
      for (int d = 0; d < nd; ++d) put64(buf, &at, (uint64_t)dims[d]);
      for (int d = nd - 1; d >= 0; --d) {
        strides[d] = stride;
        stride *= dims[d];
      }
      for (int d = 0; d < nd; ++d) put64(buf, &at, (uint64_t)strides[d]);
      put32(buf, &at, 0);
      if ((uint64_t)stride * elem <= size) continue; /* only when the packed bytes are exactly dense */
    } else { /* one block of 16 / 4096 on the last dimension, strides from the saved layout */
      what = c == 5 ? "a block of 16 on the last dim" : "a block of 4096 on dim 0";
      put32(buf, &at, (uint32_t)nd);
      for (int d = 0; d < nd; ++d) put64(buf, &at, (uint64_t)dims[d]);
      memcpy(buf + at, lay + 20 + 8 * (size_t)nd, 8 * (size_t)nd);
      at += 8 * (size_t)nd;
      put32(buf, &at, 1);
      put64(buf, &at, c == 5 ? 16 : 4096);
      put64(buf, &at, c == 5 ? (uint64_t)(nd - 1) : 0);
    }
    put64(buf, &at, size);
    memcpy(buf + at, lay + nbl_at + 4 + 16 * (size_t)nbl + 8, 24); /* problem */
    at += 24;
    size_t lsz = at - lf - 4, p = lf;
    put32(buf, &p, (uint32_t)lsz);
    load_crafted(s, k, buf, at, what);
  }
}

/* QNNPACK layouts: every kind, and blockings of which some give the same
 * packed size (then the weight is decoded with them and re-packed). */
static void craft_qnnpack(suite_t* s, uint32_t k, const uint8_t* rec, size_t lf) {
  static const uint32_t blocks[] = {1, 2, 3, 4, 8, 16, 64};
  const size_t nb = sizeof blocks / sizeof blocks[0];
  const uint8_t* lay = rec + lf + 4;
  uint8_t buf[2048];
  char what[96];
  for (uint32_t kind = 0; kind < 4; ++kind) {
    for (size_t a = 0; a < nb; ++a) {
      for (size_t b = 0; b < nb; ++b) {
        memcpy(buf, rec, lf + 4 + 36);
        size_t at = lf + 4 + 8;
        put32(buf, &at, kind);
        put32(buf, &at, kind == 1 ? 0 : blocks[a]); /* nr */
        put32(buf, &at, kind == 1 ? 0 : blocks[b]); /* kr */
        put32(buf, &at, kind == 1 ? blocks[a] : 0); /* cr */
        if (kind == 1 && b > 0) continue;
        (void)lay;
        snprintf(what, sizeof what, "QNNPACK kind %u blocking %u x %u", kind, blocks[a], blocks[b]);
        load_crafted(s, k, buf, lf + 4 + 36, what);
      }
    }
  }
}

static void suite_crafted(suite_t* s) {
  const uint32_t count = rd32(s->bytes + 20);
  for (uint32_t k = 0; k < count; ++k) {
    const uint8_t* e = s->bytes + 256 + k * 32;
    if (rd32(e) != 1) continue;
    const uint8_t* rec = s->bytes + rd64(e + 8);
    const size_t size = (size_t)rd64(e + 16);
    const size_t lf = layout_field(rec, size);
    if (lf == 0 || size > 1024) continue;
    const uint32_t tag = rd32(rec + lf + 4);
    if (tag == DNNL_TAG) craft_onednn(s, k, rec, lf);
    if (tag == QNNP_TAG && rd32(rec + lf) == 36) craft_qnnpack(s, k, rec, lf);
  }
  pwrite_all(s->fd, s->bytes, s->size, 0);
}

static void run_suite(const char* name, const char* file, float s_in) {
  suite_t s;
  const double t0 = now_s();
  if (!setup_suite(&s, name, file, s_in)) {
    free(s.bytes);
    free(s.region);
    free(s.ref.p);
    return;
  }
  suite_flips(&s);
  const double t1 = now_s();
  suite_fields(&s);
  suite_resealed(&s);
  suite_crafted(&s);
  suite_foreign(&s);
  suite_truncate(&s);
  close(s.fd);
  unlink(s.variant);
  const double t2 = now_s();
  long bytes_in[R_COUNT] = {0};
  for (size_t i = 0; i < s.size; ++i) ++bytes_in[s.region[i]];
  printf("corruption %s: %zu bytes (", name, s.size);
  for (int r = 0; r < R_COUNT; ++r) printf("%s%s %ld", r ? ", " : "", kRegion[r], bytes_in[r]);
  printf(")\n");
  printf("  flips with verify: %ld variants, %ld FILE_FORMAT, %ld padding variants loaded (%ld run bit-identical)\n",
         s.flips, s.flips_format, s.flips_pad_ok, s.flips_pad_probed);
  printf("  flips without verify (header, table, records): %ld variants, %ld FILE_FORMAT, %ld loaded and ran, %ld other\n",
         s.noverify, s.noverify_format, s.noverify_ok, s.noverify_other);
  printf("  boundary field values without verify: %ld variants, %ld FILE_FORMAT, %ld loaded and ran\n",
         s.fields, s.fields_format, s.fields_ok);
  printf("  resealed header/table flips (verify 1 and 0): %ld variants, %ld FILE_FORMAT, %ld loaded and ran\n",
         s.resealed, s.resealed_format, s.resealed_ok);
  printf("  crafted layouts, resealed (verify 1 and 0): %ld variants, %ld FILE_FORMAT, %ld loaded and ran\n",
         s.crafted, s.crafted_format, s.crafted_ok);
  printf("  truncations: %ld (FILE_FORMAT), extensions: %ld\n", s.truncated, s.extended);
  printf("  accepted variants whose runs returned an error: %ld\n", s.ran_failed);
  printf("  time: flips %.1f s, the rest %.1f s\n", t1 - t0, t2 - t1);
  free(s.bytes);
  free(s.region);
  free(s.ref.p);
}

static void test_corruption(void) {
  const backend_t* dnnl = find_backend(QPACK_BACKEND_ONEDNN);
  const backend_t* qnnp = find_backend(QPACK_BACKEND_QNNPACK);
  char path[600];
  static op_data d;
  /* A: a graph over one small conv and one linear, with host bytes and DATA
   * sections (200 bytes, 1 byte, empty). */
  const backend_t* ga = dnnl && (dnnl->conv2d_modes & 1u) ? dnnl : qnnp;
  if (ga != NULL) {
    qpack_graph* g = make_graph(ga->id, ga == dnnl ? 0 : 1);
    const qpack_graph* gs[1] = {g};
    const char host[] = "host section, 29 bytes long.";
    static uint8_t d1[200], d2[1];
    fill_u8(d1, sizeof d1, 31);
    const void* data[3] = {d1, d2, NULL};
    const size_t data_sizes[3] = {sizeof d1, sizeof d2, 0};
    qpack_save_params sp;
    memset(&sp, 0, sizeof sp);
    sp.num_graphs = 1;
    sp.graphs = gs;
    sp.host_data = host;
    sp.host_size = sizeof host;
    sp.num_data = 3;
    sp.data = data;
    sp.data_sizes = data_sizes;
    path_in(path, sizeof path, "corrupt-graph.qpk");
    EXPECT(g != NULL && OK(qpack_model_save(&sp, path)), "corruption: save graph file");
    qpack_graph_destroy(g);
    run_suite(ga == dnnl ? "graph-onednn-f32" : "graph-qnnpack-u8", "corrupt-graph.qpk", kStaticIn);
  }
  /* B: a QNNPACK static int8 conv (bias packed for the input scale of a first
   * run) and a dynamic int8 linear, both with their originals. */
  if (qnnp != NULL) {
    static const conv_geom cg = {"b", 4, 8, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
    qpack_conv2d* c = NULL;
    qpack_linear* l = NULL;
    EXPECT(OK(make_conv(qnnp->id, QPACK_MODE_INT8_STATIC, &cg, 0.0f, 0.08f, 100, &d, 505, &c)),
           "corruption: QNNPACK conv");
    EXPECT(OK(make_linear(qnnp->id, QPACK_MODE_INT8_DYNAMIC, 12, 5, 0, &d, 606, &l)),
           "corruption: QNNPACK linear");
    bytes_t first = {0};
    EXPECT(c != NULL && OK(run_conv(c, kStaticIn, 120, &first)), "corruption: first run");
    free(first.p);
    const qpack_conv2d* cs[1] = {c};
    const qpack_linear* ls[1] = {l};
    qpack_save_params sp;
    memset(&sp, 0, sizeof sp);
    sp.num_convs = 1;
    sp.convs = cs;
    sp.num_linears = 1;
    sp.linears = ls;
    sp.with_originals = 1;
    path_in(path, sizeof path, "corrupt-qnnpack.qpk");
    EXPECT(c != NULL && l != NULL && OK(qpack_model_save(&sp, path)), "corruption: save QNNPACK file");
    qpack_conv2d_destroy(c);
    qpack_linear_destroy(l);
    run_suite("qnnpack-int8", "corrupt-qnnpack.qpk", kStaticIn);
  }
  /* C: oneDNN int8 (static depthwise conv with compensation, static linear). */
  if (dnnl != NULL && ((dnnl->conv2d_modes >> QPACK_MODE_INT8_STATIC) & 1u)) {
    qpack_conv2d* c = NULL;
    qpack_linear* l = NULL;
    static const conv_geom cg = {"c", 8, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1};
    EXPECT(OK(make_conv(dnnl->id, QPACK_MODE_INT8_STATIC, &cg, kStaticIn, 0.08f, 100, &d, 707, &c)),
           "corruption: oneDNN conv");
    EXPECT(OK(make_linear(dnnl->id, QPACK_MODE_INT8_STATIC, 10, 6, kStaticIn, &d, 808, &l)),
           "corruption: oneDNN linear");
    const qpack_conv2d* cs[1] = {c};
    const qpack_linear* ls[1] = {l};
    qpack_save_params sp;
    memset(&sp, 0, sizeof sp);
    sp.num_convs = 1;
    sp.convs = cs;
    sp.num_linears = 1;
    sp.linears = ls;
    path_in(path, sizeof path, "corrupt-onednn.qpk");
    EXPECT(c != NULL && l != NULL && OK(qpack_model_save(&sp, path)), "corruption: save oneDNN file");
    qpack_conv2d_destroy(c);
    qpack_linear_destroy(l);
    run_suite("onednn-int8", "corrupt-onednn.qpk", kStaticIn);
  }
}

/* ---- 3. IO errors and saving over a mapped file ------------------------------------- */

static void expect_io(qpack_status st, const char* path, const char* what) {
  EXPECT(st == QPACK_STATUS_IO && strstr(qpack_last_error(), path) != NULL,
         "%s: status %d, want IO naming %s", what, st, path);
}

static void test_io(void) {
  const backend_t* b = g_num_backends > 0 ? &g_backends[0] : NULL;
  if (b == NULL) return;
  static op_data d;
  const qpack_mode mode = (b->linear_modes & 1u) ? QPACK_MODE_F32 : QPACK_MODE_INT8_STATIC;
  qpack_linear *l1 = NULL, *l2 = NULL, *h = NULL;
  EXPECT(OK(make_linear(b->id, mode, 33, 17, kStaticIn, &d, 11, &l1)), "io: linear 1");
  EXPECT(OK(make_linear(b->id, mode, 33, 17, kStaticIn, &d, 12, &l2)), "io: linear 2");
  if (l1 == NULL || l2 == NULL) {
    qpack_linear_destroy(l1);
    qpack_linear_destroy(l2);
    return;
  }
  char missing[600], sub[600], under_dir[600], file[600], under_file[600];
  path_in(missing, sizeof missing, "missing.qpk");
  path_in(sub, sizeof sub, "a-folder");
  path_in(under_dir, sizeof under_dir, "no-such-folder/x.qpk");
  path_in(file, sizeof file, "plain-file");
  path_in(under_file, sizeof under_file, "plain-file/x.qpk");
  mkdir(sub, 0700);
  write_file(file, "not a model", 11);

  qpack_model* m = NULL;
  expect_io(qpack_model_load(missing, NULL, &m), missing, "load a missing file");
  EXPECT(m == NULL, "no model on failure");
  expect_io(qpack_linear_load(missing, NULL, &h), missing, "linear_load a missing file");
  expect_io(qpack_model_load(sub, NULL, &m), sub, "load a folder");
  qpack_load_options o;
  qpack_load_options_init(&o);
  o.map = 0;
  expect_io(qpack_model_load(sub, &o, &m), sub, "load a folder (map=0)");
  expect_io(qpack_model_load("/dev/null", NULL, &m), "/dev/null", "load a character device");
  expect_io(qpack_model_load(under_file, NULL, &m), under_file, "load under a plain file");
  EXPECT(qpack_model_load(file, NULL, &m) == QPACK_STATUS_FILE_FORMAT &&
             strstr(qpack_last_error(), file) != NULL,
         "load a short non-model file: FILE_FORMAT naming it");
  uint8_t junk[5000];
  fill_u8(junk, sizeof junk, 99);
  write_file(file, junk, sizeof junk);
  EXPECT(qpack_model_load(file, NULL, &m) == QPACK_STATUS_FILE_FORMAT &&
             strstr(qpack_last_error(), "magic") != NULL,
         "load random bytes: FILE_FORMAT (magic)");
  write_file(file, "", 0);
  EXPECT(qpack_model_load(file, NULL, &m) == QPACK_STATUS_FILE_FORMAT, "load an empty file");
  EXPECT(qpack_model_load(file, &o, &m) == QPACK_STATUS_FILE_FORMAT, "load an empty file (map=0)");

  /* qpack_model_load_fd: the caller's descriptor, left open; the name in messages. */
  char fd_path[600];
  path_in(fd_path, sizeof fd_path, "by-fd.qpk");
  EXPECT(OK(qpack_linear_save(l1, fd_path)), "save for load_fd");
  int fd = open(fd_path, O_RDONLY);
  for (int map = 1; map >= 0; --map) {
    o.map = map;
    m = NULL;
    qpack_model_info mi;
    EXPECT(OK(qpack_model_load_fd(fd, "by-fd", &o, &m)) && OK(qpack_model_get_info(m, &mi)) &&
               mi.num_ops == 1 && mi.mapped == map,
           "load_fd (map=%d)", map);
    qpack_linear* lf = NULL;
    bytes_t a = {0}, b2 = {0};
    EXPECT(m != NULL && OK(qpack_model_linear(m, 0, &lf)) && OK(run_linear(lf, kStaticIn, 120, &a)) &&
               OK(run_linear(l1, kStaticIn, 120, &b2)) && same_bytes(&a, &b2),
           "load_fd (map=%d): outputs", map);
    free(a.p);
    free(b2.p);
    qpack_linear_destroy(lf);
    qpack_model_destroy(m);
  }
  EXPECT(fcntl(fd, F_GETFD) != -1, "load_fd leaves the descriptor open");
  m = NULL;
  EXPECT(OK(qpack_model_load_fd(fd, NULL, NULL, &m)), "load_fd without a name");
  qpack_model_destroy(m);
  EXPECT(qpack_model_load_fd(fd, "x", NULL, NULL) == QPACK_STATUS_INVALID_ARGUMENT, "load_fd NULL out");
  EXPECT(qpack_model_load_fd(-1, "x", NULL, &m) == QPACK_STATUS_INVALID_ARGUMENT && m == NULL,
         "load_fd of -1");
  close(fd);
  m = NULL;
  expect_io(qpack_model_load_fd(fd, "closed-descriptor", NULL, &m), "closed-descriptor",
            "load_fd of a closed descriptor");
  fd = open(sub, O_RDONLY);
  expect_io(qpack_model_load_fd(fd, "a-folder-fd", NULL, &m), "a-folder-fd", "load_fd of a folder");
  close(fd);
  fd = open(fd_path, O_WRONLY);
  expect_io(qpack_model_load_fd(fd, "write-only-fd", NULL, &m), "write-only-fd",
            "load_fd of a write-only descriptor (map=1)");
  o.map = 0;
  expect_io(qpack_model_load_fd(fd, "write-only-fd", &o, &m), "write-only-fd",
            "load_fd of a write-only descriptor (map=0)");
  close(fd);
  fd = open(file, O_RDONLY); /* the empty file */
  EXPECT(qpack_model_load_fd(fd, "empty-fd", NULL, &m) == QPACK_STATUS_FILE_FORMAT &&
             strstr(qpack_last_error(), "empty-fd") != NULL,
         "load_fd of an empty file: FILE_FORMAT naming it");
  close(fd);

  expect_io(qpack_linear_save(l1, under_dir), under_dir, "save into a missing folder");
  expect_io(qpack_linear_save(l1, under_file), under_file, "save under a plain file");
  expect_io(qpack_linear_save(l1, sub), sub, "save over a folder");
  struct stat st;
  EXPECT(stat(sub, &st) == 0 && S_ISDIR(st.st_mode), "the folder is still there");
  if (geteuid() != 0) {
    char ro[600], in_ro[600];
    path_in(ro, sizeof ro, "read-only");
    path_in(in_ro, sizeof in_ro, "read-only/x.qpk");
    mkdir(ro, 0500);
    expect_io(qpack_linear_save(l1, in_ro), in_ro, "save into a read-only folder");
    chmod(ro, 0700);
  } else {
    printf("skip save into a read-only folder: running as root (permissions do not apply)\n");
  }
  EXPECT(count_entries(".tmp-") == 0, "no temporary files left by failed saves");

  /* Saving over a file that live handles map: they keep the old bytes. */
  char path[600];
  path_in(path, sizeof path, "replaced.qpk");
  EXPECT(OK(qpack_linear_save(l1, path)), "save 1");
  qpack_linear *mapped = NULL, *read = NULL, *fresh = NULL;
  o.map = 1;
  EXPECT(OK(qpack_linear_load(path, &o, &mapped)), "load 1 mapped");
  o.map = 0;
  EXPECT(OK(qpack_linear_load(path, &o, &read)), "load 1 read");
  struct stat before, after;
  stat(path, &before);
  bytes_t y1 = {0}, y2 = {0}, y = {0};
  EXPECT(OK(run_linear(l1, kStaticIn, 120, &y1)) && OK(run_linear(l2, kStaticIn, 120, &y2)) &&
             !same_bytes(&y1, &y2),
         "two different linears");
  for (int round = 0; round < 3; ++round) {
    EXPECT(OK(qpack_linear_save(round % 2 ? l1 : l2, path)), "save over the mapped file");
    y.n = 0;
    EXPECT(mapped != NULL && OK(run_linear(mapped, kStaticIn, 120, &y)) && same_bytes(&y, &y1),
           "the mapped handle runs on the old bytes after save %d", round);
    y.n = 0;
    EXPECT(read != NULL && OK(run_linear(read, kStaticIn, 120, &y)) && same_bytes(&y, &y1),
           "the read handle is unchanged after save %d", round);
    EXPECT(OK(qpack_linear_load(path, NULL, &fresh)), "load the new file");
    y.n = 0;
    EXPECT(fresh != NULL && OK(run_linear(fresh, kStaticIn, 120, &y)) &&
               same_bytes(&y, round % 2 ? &y1 : &y2),
           "the new file holds the new op");
    qpack_linear_destroy(fresh);
    fresh = NULL;
  }
  stat(path, &after);
  EXPECT(before.st_ino != after.st_ino, "save renames a new file over the old one");
  bytes_t w = {0}, w1 = {0};
  EXPECT(OK(unpack_linear(mapped, &w)) && OK(unpack_linear(l1, &w1)) && same_bytes(&w, &w1),
         "the mapped handle unpacks the old weights");
  EXPECT(count_entries(".tmp-") == 0, "no temporary files left by saves");
  free(y.p);
  free(y1.p);
  free(y2.p);
  free(w.p);
  free(w1.p);
  qpack_linear_destroy(mapped);
  qpack_linear_destroy(read);
  qpack_linear_destroy(l1);
  qpack_linear_destroy(l2);
}

/* ---- threads: concurrent loads, and runs on one loaded op ---------------------------- */

typedef struct {
  const char* path;
  const qpack_conv2d* conv;
  const bytes_t* ref;
  int ok;
} thread_arg;

static void* load_and_run(void* p) {
  thread_arg* a = p;
  a->ok = 1;
  for (int i = 0; i < 4; ++i) {
    qpack_load_options o;
    qpack_load_options_init(&o);
    o.map = i & 1;
    qpack_conv2d* c = NULL;
    bytes_t y = {0};
    a->ok &= OK(qpack_conv2d_load(a->path, &o, &c)) && OK(run_conv(c, kStaticIn, 120, &y)) &&
             same_bytes(&y, a->ref);
    free(y.p);
    qpack_conv2d_destroy(c);
  }
  return NULL;
}

static void* run_shared(void* p) {
  thread_arg* a = p;
  a->ok = 1;
  for (int i = 0; i < 4; ++i) {
    bytes_t y = {0};
    a->ok &= OK(run_conv(a->conv, kStaticIn, 120, &y)) && same_bytes(&y, a->ref);
    free(y.p);
  }
  return NULL;
}

static void test_threads(void) {
  for (int bi = 0; bi < g_num_backends; ++bi) {
    const backend_t* b = &g_backends[bi];
    if (!((b->conv2d_modes >> QPACK_MODE_INT8_STATIC) & 1u)) continue;
    static op_data d;
    qpack_conv2d* src = NULL;
    EXPECT(OK(make_conv(b->id, QPACK_MODE_INT8_STATIC, &kConvs[0], kStaticIn, 0.09f, 131, &d, 9, &src)),
           "threads: conv");
    if (src == NULL) continue;
    char path[600];
    path_in(path, sizeof path, "threads.qpk");
    bytes_t ref = {0};
    EXPECT(OK(qpack_conv2d_save(src, path)) && OK(run_conv(src, kStaticIn, 120, &ref)), "threads: save");
    qpack_conv2d* loaded = NULL;
    EXPECT(OK(qpack_conv2d_load(path, NULL, &loaded)), "threads: load");
    enum { T = 4 };
    pthread_t t[T];
    thread_arg args[T];
    for (int i = 0; i < T; ++i) {
      args[i].path = path;
      args[i].conv = loaded;
      args[i].ref = &ref;
      args[i].ok = 0;
      pthread_create(&t[i], NULL, i % 2 ? load_and_run : run_shared, &args[i]);
    }
    for (int i = 0; i < T; ++i) {
      pthread_join(t[i], NULL);
      EXPECT(args[i].ok, "threads (%s): thread %d %s", b->name, i,
             i % 2 ? "loads and runs" : "runs the shared loaded op");
    }
    free(ref.p);
    qpack_conv2d_destroy(loaded);
    qpack_conv2d_destroy(src);
  }
}

int main(void) {
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/qpack-model-file-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(g_dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  g_trace = getenv("QPACK_TEST_TRACE") != NULL && atoi(getenv("QPACK_TEST_TRACE")) != 0;
  /* One thread inside each run: thousands of tiny loads and runs, where
   * OpenMP's spinning workers only take time from whatever else runs on the
   * machine (the threads test runs ops from several threads). */
  qpack_set_num_threads(1);
  find_backends();
  for (int i = 0; i < g_num_backends; ++i) {
    printf("backend %s: linear modes 0x%x, conv2d modes 0x%x\n", g_backends[i].name,
           g_backends[i].linear_modes, g_backends[i].conv2d_modes);
  }
  double t[7];
  t[0] = now_s();
  test_round_trips();
  t[1] = now_s();
  test_graphs();
  t[2] = now_s();
  test_accessors();
  t[3] = now_s();
  test_io();
  t[4] = now_s();
  test_threads();
  t[5] = now_s();
  test_corruption();
  t[6] = now_s();
  printf("time: round trips %.1f s, graphs %.1f s, accessors %.1f s, io %.1f s, threads %.1f s, corruption %.1f s\n",
         t[1] - t[0], t[2] - t[1], t[3] - t[2], t[4] - t[3], t[5] - t[4], t[6] - t[5]);
  remove_tree(g_dir);
  printf("model_file: %d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
