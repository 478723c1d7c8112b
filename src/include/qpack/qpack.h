/*
 * qpack.h: the one public C header of libqpack.
 *
 * Prepacked CPU inference weights with explicit lifetimes, over oneDNN (x86)
 * and QNNPACK (uint8, the kernels PyTorch uses on phones).
 *
 * Conventions
 *   - Every function returns a qpack_status; QPACK_STATUS_SUCCESS is 0.
 *     On failure, qpack_last_error() gives a thread-local message that says
 *     what went wrong and how to fix it.
 *   - Outputs come last and are named *_out.
 *   - Every create has a destroy; destroy(NULL) is a no-op.
 *   - Weights are row-major [out_features, in_features]; activations are
 *     row-major [batch, features].
 *   - Ownership: create copies what it needs from the caller's arrays; the
 *     caller keeps ownership of every pointer it passes in.
 *
 * Threads
 *   - run, unpack, info and release_original may be called concurrently on one
 *     object from any number of threads; runs take no lock.
 *   - close may be called while other threads run: runs already started finish
 *     with the state they started with; later calls fail with
 *     QPACK_STATUS_CLOSED. Packed memory is freed when the last run ends.
 *   - destroy must not race with any other call on the same object.
 */
#ifndef QPACK_QPACK_H_
#define QPACK_QPACK_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define QPACK_API __declspec(dllexport)
#elif defined(__GNUC__)
#define QPACK_API __attribute__((visibility("default")))
#else
#define QPACK_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qpack_status {
  QPACK_STATUS_SUCCESS = 0,
  QPACK_STATUS_INVALID_ARGUMENT = 1, /* bad shape, value or parameter */
  QPACK_STATUS_INVALID_TYPE = 2,     /* wrong dtype */
  QPACK_STATUS_UNSUPPORTED = 3,      /* valid, but this backend cannot do it */
  QPACK_STATUS_OUT_OF_MEMORY = 4,
  QPACK_STATUS_CLOSED = 5,           /* object was closed */
  /* 6 is reserved (was RELEASED: nothing needs a released original, unpack
   * reconstructs it from the packed form). */
  QPACK_STATUS_BACKEND_ERROR = 7,    /* oneDNN or QNNPACK failed */
  QPACK_STATUS_INTERNAL = 8,
  QPACK_STATUS_FILE_FORMAT = 9,      /* a model file is corrupt, truncated, or packed for
                                        another build or CPU (see qpack_model_load) */
  QPACK_STATUS_IO = 10,              /* a file could not be opened, read or written */
} qpack_status;

typedef enum qpack_backend {
  QPACK_BACKEND_AUTO = 0,
  QPACK_BACKEND_ONEDNN = 1,
  QPACK_BACKEND_QNNPACK = 2,
} qpack_backend;

typedef enum qpack_mode {
  QPACK_MODE_F32 = 0,          /* f32 weight, f32 in, f32 out */
  QPACK_MODE_INT8_STATIC = 1,  /* s8 weight, u8 in (scale, zp), u8 out */
  QPACK_MODE_INT8_DYNAMIC = 2, /* s8 weight, f32 in (quantized per call), f32 out */
} qpack_mode;

/* Retain policy of a new object: keep or release the original weights once
 * packed. DEFAULT defers to the thread-local override, then to the process
 * default (set by the QPACK_MOBILE build option, changeable at run time). */
typedef enum qpack_retain {
  QPACK_RETAIN_DEFAULT = -1,
  QPACK_RETAIN_RELEASE = 0,
  QPACK_RETAIN_KEEP = 1,
} qpack_retain;

/* ---- errors, policy, threads, build ---------------------------------- */

/* Message of the last failed call on this thread ("" if none). Valid until
 * the next qpack call on this thread. */
QPACK_API const char* qpack_last_error(void);

QPACK_API int qpack_get_default_retain(void);          /* 0 or 1 */
QPACK_API void qpack_set_default_retain(int keep);     /* process-wide */
/* Thread-local override: QPACK_RETAIN_DEFAULT clears it. Returns the previous. */
QPACK_API int qpack_set_thread_retain(int retain);
QPACK_API int qpack_get_thread_retain(void);
/* Resolve a per-object request (QPACK_RETAIN_*) to 0 or 1. */
QPACK_API int qpack_resolve_retain(int retain);

/* Threads used inside one run (oneDNN OpenMP, QNNPACK pthreadpool). */
QPACK_API qpack_status qpack_set_num_threads(int num_threads);
QPACK_API int qpack_get_num_threads(void);

/* 1 in a process forked after qpack was loaded: there every op runs on the
 * calling thread (the parent's thread pools do not survive fork). */
QPACK_API int qpack_in_forked_child(void);

QPACK_API int qpack_build_mobile(void); /* 1 when built with QPACK_MOBILE=ON */
/* qpack's version, "MAJOR.MINOR.PATCH" (static storage). */
QPACK_API const char* qpack_version(void);

/* How this library was built. Strings are static storage. */
typedef struct qpack_build_info {
  const char* version;         /* qpack_version() */
  const char* target_arch;     /* "x86_64", "aarch64", "armv7", ... */
  const char* qnnpack_kernels; /* QNNPACK micro-kernel family compiled in:
                                  "sse2", "aarch64-neon", "aarch32-neon", or
                                  "" without QNNPACK */
  const char* threading;       /* "openmp" or "pthreadpool" (QPACK_OPENMP=OFF) */
  int mobile;                  /* QPACK_MOBILE=ON: originals released by default */
  int with_onednn;             /* oneDNN backend compiled in */
  int with_qnnpack;            /* QNNPACK backend compiled in */
} qpack_build_info;

QPACK_API qpack_status qpack_get_build_info(qpack_build_info* info_out);
/* The same as one NUL-terminated line, e.g. "qpack 0.1.0; arch=aarch64;
 * backends=qnnpack; qnnpack_kernels=aarch64-neon; threading=pthreadpool;
 * mobile=1" (truncated to size - 1 characters). */
QPACK_API qpack_status qpack_build_info_string(char* buf, size_t size);

/* uint8 (scale, zero point) for activations in [min, max] (widened to hold
 * 0), as PyTorch's ChooseQuantizationParams: what dynamic int8 layers use per
 * call and what qpack.freeze calibrates static layers with. */
QPACK_API qpack_status qpack_choose_qparams_u8(float min, float max, float* scale_out,
                                               int32_t* zero_point_out);
/* The same rule onto [0, qmax] (qmax in [1, 255]): 127 for a backend whose
 * qpack_backend_int8_input_max is 127. */
QPACK_API qpack_status qpack_choose_qparams_u8_max(float min, float max, int32_t qmax,
                                                   float* scale_out, int32_t* zero_point_out);

/* ---- attention ------------------------------------------------------------ */

/* Scaled dot-product attention in fp32, for each batch b and head h:
 * out[b][h] = softmax(scale * q[b][h] k[b][h]^T) v[b][h], q and out of L rows,
 * k and v of S rows, every row D floats (contiguous); *_strides[0..2] are
 * the element strides of the batch, the head and the row. causal: row i
 * sees keys j <= i (PyTorch's is_causal). Runs on qpack_get_num_threads()
 * threads, with AVX-512 where the CPU has it; values within float rounding of
 * PyTorch's scaled_dot_product_attention. INVALID_ARGUMENT on negative sizes,
 * D < 1, S = 0 with L > 0, a non-finite scale or NULL pointers. */
QPACK_API qpack_status qpack_attention_f32(const float* q, const int64_t q_strides[3], const float* k,
                                           const int64_t k_strides[3], const float* v,
                                           const int64_t v_strides[3], float* out,
                                           const int64_t out_strides[3], int64_t batch, int64_t heads,
                                           int64_t L, int64_t S, int64_t D, float scale, int causal);
/* The same with mask (or NULL) added to the scaled scores before the softmax:
 * softmax(scale * q k^T + mask[b][h]) v, as PyTorch's float attn_mask (a
 * position bias: LeViT's attention biases), and v's and out's rows of Dv
 * floats (q's and k's of D). mask is [batch][heads][L][S], each row S
 * contiguous floats; mask_strides[0..2] are the element strides of the batch,
 * the head and the row, 0 for a mask shared by every batch or head. A row
 * whose every score the mask makes -inf gets output 0 (as PyTorch). With
 * causal, row i then sees keys j <= i only. INVALID_ARGUMENT also for Dv < 1
 * and a mask without its strides. */
QPACK_API qpack_status qpack_attention_f32_mask(const float* q, const int64_t q_strides[3], const float* k,
                                                const int64_t k_strides[3], const float* v,
                                                const int64_t v_strides[3], const float* mask,
                                                const int64_t mask_strides[3], float* out,
                                                const int64_t out_strides[3], int64_t batch, int64_t heads,
                                                int64_t L, int64_t S, int64_t D, int64_t Dv, float scale,
                                                int causal);

/* ---- backends ------------------------------------------------------------ */

/* What a backend is and can do. Mode sets hold bit (1u << qpack_mode) for
 * each mode the op supports on that backend. */
typedef struct qpack_backend_info {
  qpack_backend backend;
  const char* name;       /* "onednn", "qnnpack": what users pass (static storage) */
  int compiled;           /* built into this library */
  int available;          /* compiled and usable on this CPU */
  int asymmetric_weights; /* int8 weights may have nonzero zero points */
  unsigned linear_modes;
  unsigned conv2d_modes;
  unsigned graph_nodes;       /* bit (1u << qpack_node_kind) for each u8 graph node kind it
                                 runs with its own operators (qpack_graph_node_backend) */
  unsigned graph_activations; /* bit (1u << qpack_activation): the ACTIVATION nodes among them */
} qpack_backend_info;

/* Backends qpack knows, in the order AUTO prefers them (the first available
 * one that supports the op and mode, and takes the weight's zero points if it
 * has any): on x86-64 oneDNN then QNNPACK, elsewhere QNNPACK then oneDNN. */
QPACK_API int qpack_backend_count(void);
/* index in [0, qpack_backend_count()). */
QPACK_API qpack_status qpack_backend_get_info(int index, qpack_backend_info* info_out);
/* Writes a NUL-terminated, human-readable description into buf. */
QPACK_API qpack_status qpack_backend_describe(qpack_backend backend, char* buf, size_t size);
QPACK_API int qpack_backend_available(qpack_backend backend);
/* The largest uint8 input value the backend's static int8 kernels take at full
 * speed on this CPU: 255, or 127 for oneDNN on a CPU without VNNI, whose u8 x s8
 * kernels would saturate int16 pair sums there: qpack then runs wider inputs
 * split, exact at twice the work, unless every weight of the op is within
 * [-64, 64] (then any input runs fused, exact). 0 when the backend is not
 * available. */
QPACK_API int qpack_backend_int8_input_max(qpack_backend backend);

/* Counters of one packed object (every op, every backend and mode). */
typedef struct qpack_op_stats {
  uint64_t states_built;  /* packed weight states built, the first pack included
                             (QNNPACK: one per input scale; oneDNN convolution:
                             one per weight layout a kernel asked for) */
  uint64_t cache_hits;    /* runs that found everything they needed already
                             built (QNNPACK: the state of their input scale;
                             oneDNN: the primitive of their shape and thread count) */
  uint64_t evictions;     /* entries dropped from a bounded cache (states, primitives) */
  uint64_t runs;          /* run calls that passed the argument checks */
  uint64_t split_runs;    /* int8 runs on oneDNN without VNNI that split their input
                             to stay exact (twice the work): inputs above 127 on
                             weights outside [-64, 64] (0 elsewhere) */
} qpack_op_stats;

/* ---- packed linear ----------------------------------------------------- */

typedef struct qpack_linear qpack_linear;

typedef struct qpack_linear_params {
  int64_t in_features;          /* K >= 1 */
  int64_t out_features;         /* N >= 1 */
  qpack_mode mode;
  qpack_backend backend;        /* AUTO: oneDNN for f32; int8 on x86-64 oneDNN (QNNPACK for
                                   weights with zero points), elsewhere QNNPACK */
  int retain;                   /* qpack_retain */
  const void* weight;           /* [N, K]: float (F32) or int8_t (INT8_*) */
  const float* weight_scales;   /* INT8_*: 1 (per-tensor) or N (per-channel) */
  const int32_t* weight_zero_points; /* NULL: symmetric; else as many as scales, in [-128, 127] */
  int64_t num_weight_scales;
  const float* bias;            /* NULL or [N] */
  float clamp_min;              /* fused activation, real domain; -INFINITY for none */
  float clamp_max;              /* +INFINITY for none */
  float input_scale;            /* INT8_STATIC: expected input scale (0: unknown yet) */
  int32_t input_zero_point;
  float output_scale;           /* INT8_STATIC */
  int32_t output_zero_point;
} qpack_linear_params;

/* Fill params with defaults (no clamp, AUTO backend, DEFAULT retain). */
QPACK_API void qpack_linear_params_init(qpack_linear_params* params);

/* After close, get_info still succeeds: closed = 1 and every other field 0. */
typedef struct qpack_linear_info {
  int64_t in_features, out_features;
  qpack_mode mode;
  qpack_backend backend;
  int has_bias;
  int has_original;
  int closed;
  int64_t num_weight_scales;
  size_t nbytes_packed;   /* bytes of packed state(s) held now */
  size_t nbytes_original; /* bytes of original weights held (0 after release) */
} qpack_linear_info;

typedef qpack_op_stats qpack_linear_stats;

/* Packs the weights. The object owns a copy of everything it keeps. */
QPACK_API qpack_status qpack_linear_create(const qpack_linear_params* params,
                                           qpack_linear** linear_out);
/* Frees everything; NULL is a no-op. Must not race with other calls. */
QPACK_API void qpack_linear_destroy(qpack_linear* linear);
/* Frees packed memory (at once, or when the last in-flight run ends);
 * later calls fail with QPACK_STATUS_CLOSED. Idempotent. */
QPACK_API qpack_status qpack_linear_close(qpack_linear* linear);

/* F32 and INT8_DYNAMIC: x [batch, K] float -> y [batch, N] float. */
QPACK_API qpack_status qpack_linear_run_f32(const qpack_linear* linear, int64_t batch,
                                            const float* x, float* y_out);
/* INT8_STATIC: x [batch, K] uint8 with (input_scale, input_zero_point)
 * -> y [batch, N] uint8 with the object's output scale and zero point.
 * QNNPACK's kernels read (and ignore) up to 8 bytes before and after the
 * rows of a uint8 input, as PyTorch's own buffers allow: x must not start
 * at the first byte of a mapping (malloc'd and stack buffers are fine);
 * qpack's internal buffers keep 16 readable bytes on both sides. */
QPACK_API qpack_status qpack_linear_run_u8(const qpack_linear* linear, int64_t batch,
                                           const uint8_t* x, float input_scale,
                                           int32_t input_zero_point, uint8_t* y_out);

/* Drops the original weights; unpack keeps working from the packed form. */
QPACK_API qpack_status qpack_linear_release_original(qpack_linear* linear);
/* Reconstructs the original weights bit-exactly: weight_out [N, K] (float or
 * int8_t by mode), bias_out [N] float (may be NULL). */
QPACK_API qpack_status qpack_linear_unpack(const qpack_linear* linear, void* weight_out,
                                           float* bias_out);
/* Works on a closed object too (see qpack_linear_info). */
QPACK_API qpack_status qpack_linear_get_info(const qpack_linear* linear,
                                             qpack_linear_info* info_out);
QPACK_API qpack_status qpack_linear_get_stats(const qpack_linear* linear,
                                              qpack_linear_stats* stats_out);

/* ---- packed conv2d ---------------------------------------------------- */
/*
 * 2-D convolution (cross-correlation, like torch.nn.functional.conv2d) on
 * weights packed once. Conv1d is conv2d with kernel_h = 1 and input height 1.
 *
 *   weight [out_channels, in_channels / groups, kernel_h, kernel_w]
 *   x      [batch, in_channels, height, width]   in x_layout
 *   y      [batch, out_channels, out_h, out_w]   in y_layout
 *
 * Modes: F32 (oneDNN) and INT8_STATIC (oneDNN or QNNPACK; uint8 in and out).
 * QNNPACK computes in NHWC; other layouts are converted around the call.
 * Padding may be asymmetric (padding="same" with an even kernel); QNNPACK
 * then needs stride 1 in that dimension.
 */

typedef enum qpack_layout {
  QPACK_LAYOUT_NCHW = 0, /* contiguous [N, C, H, W] */
  QPACK_LAYOUT_NHWC = 1, /* channels last: contiguous [N, H, W, C] */
} qpack_layout;

typedef struct qpack_conv2d qpack_conv2d;

typedef struct qpack_conv2d_params {
  int64_t in_channels;          /* >= 1, divisible by groups */
  int64_t out_channels;         /* >= 1, divisible by groups */
  int64_t groups;               /* >= 1 */
  int64_t kernel_h, kernel_w;   /* >= 1 */
  int64_t stride_h, stride_w;   /* >= 1 */
  int64_t pad_top, pad_left, pad_bottom, pad_right; /* >= 0 */
  int64_t dilation_h, dilation_w; /* >= 1 */
  qpack_mode mode;              /* F32 or INT8_STATIC */
  qpack_backend backend;        /* AUTO: oneDNN for f32; int8 on x86-64 oneDNN (QNNPACK for
                                   weights with zero points), elsewhere QNNPACK */
  int retain;                   /* qpack_retain */
  const void* weight;           /* float (F32) or int8_t (INT8_STATIC), layout above */
  const float* weight_scales;   /* INT8: 1 (per-tensor) or out_channels */
  const int32_t* weight_zero_points; /* NULL: symmetric; else as many as scales */
  int64_t num_weight_scales;
  const float* bias;            /* NULL or [out_channels] */
  float clamp_min;              /* fused activation, real domain; -INFINITY for none */
  float clamp_max;              /* +INFINITY for none */
  float input_scale;            /* INT8_STATIC: expected input scale (0: unknown yet) */
  int32_t input_zero_point;
  float output_scale;           /* INT8_STATIC */
  int32_t output_zero_point;
} qpack_conv2d_params;

/* Fill params with defaults (stride 1, dilation 1, groups 1, no padding,
 * no clamp, AUTO backend, DEFAULT retain). */
QPACK_API void qpack_conv2d_params_init(qpack_conv2d_params* params);

/* After close, get_info still succeeds: closed = 1 and every other field 0. */
typedef struct qpack_conv2d_info {
  int64_t in_channels, out_channels, groups, kernel_h, kernel_w;
  qpack_mode mode;
  qpack_backend backend;
  int has_bias;
  int has_original;
  int closed;
  int64_t num_weight_scales;
  size_t nbytes_packed;   /* bytes of packed state(s) held now */
  size_t nbytes_original; /* bytes of original weights held (0 after release) */
} qpack_conv2d_info;

typedef qpack_op_stats qpack_conv2d_stats;

/* Packs the weights. The object owns a copy of everything it keeps. */
QPACK_API qpack_status qpack_conv2d_create(const qpack_conv2d_params* params,
                                           qpack_conv2d** conv_out);
/* Frees everything; NULL is a no-op. Must not race with other calls. */
QPACK_API void qpack_conv2d_destroy(qpack_conv2d* conv);
/* Frees packed memory (at once, or when the last in-flight run ends);
 * later calls fail with QPACK_STATUS_CLOSED. Idempotent. */
QPACK_API qpack_status qpack_conv2d_close(qpack_conv2d* conv);

/* Output spatial size for an input of height x width. */
QPACK_API qpack_status qpack_conv2d_output_size(const qpack_conv2d* conv, int64_t height,
                                                int64_t width, int64_t* out_h_out,
                                                int64_t* out_w_out);
/* F32: x float -> y float. */
QPACK_API qpack_status qpack_conv2d_run_f32(const qpack_conv2d* conv, int64_t batch,
                                            int64_t height, int64_t width,
                                            qpack_layout x_layout, const float* x,
                                            qpack_layout y_layout, float* y_out);
/* INT8_STATIC: x uint8 with (input_scale, input_zero_point) -> y uint8 with
 * the object's output scale and zero point. */
QPACK_API qpack_status qpack_conv2d_run_u8(const qpack_conv2d* conv, int64_t batch,
                                           int64_t height, int64_t width,
                                           qpack_layout x_layout, const uint8_t* x,
                                           float input_scale, int32_t input_zero_point,
                                           qpack_layout y_layout, uint8_t* y_out);

/* Drops the original weights; unpack keeps working from the packed form. */
QPACK_API qpack_status qpack_conv2d_release_original(qpack_conv2d* conv);
/* Reconstructs the original weights bit-exactly: weight_out in the weight
 * layout above (float or int8_t by mode), bias_out [out_channels] (may be NULL). */
QPACK_API qpack_status qpack_conv2d_unpack(const qpack_conv2d* conv, void* weight_out,
                                           float* bias_out);
/* Works on a closed object too (see qpack_conv2d_info). */
QPACK_API qpack_status qpack_conv2d_get_info(const qpack_conv2d* conv,
                                             qpack_conv2d_info* info_out);
QPACK_API qpack_status qpack_conv2d_get_stats(const qpack_conv2d* conv,
                                              qpack_conv2d_stats* stats_out);


/* ---- frozen graphs ---------------------------------------------------- */
/*
 * A graph of typed values and nodes, planned once per input shape and run by
 * the core in one call. Weighted nodes hold packed objects (qpack_conv2d,
 * qpack_linear) by reference: the graph keeps them alive and never copies
 * their packed weights; closing a handle does not affect a graph that uses it.
 *
 * Values carry a dtype (f32, or u8 with scale and zero point); shapes follow
 * from the input shapes at plan time. Rank-4 values [N, C, H, W] live in NHWC
 * (channels last) between nodes; other ranks are row-major. Inputs may come
 * in NCHW or NHWC; rank-4 outputs are written in the layout each output
 * tensor asks for. Everything between the edges stays in its dtype and
 * layout: static int8 convolutions and linears requantize into the next
 * value's parameters, pooling and flatten keep theirs.
 *
 * Rounding: a u8 result is its real value divided by the scale, rounded half
 * to even, plus the zero point, clamped to [0, 255] (QUANTIZE multiplies by
 * 1 / scale instead, as dynamic quantization does); u8 nodes other than
 * conv/linear compute in float on dequantized inputs (ACTIVATION through a
 * 256-entry table made at create). In a graph whose static int8 ops run on
 * QNNPACK, u8 add, pooling, clamp, sigmoid and hardswish nodes run on
 * QNNPACK's own operators where it takes their parameters
 * (qpack_graph_node_backend says which), with QNNPACK's rounding: within one
 * quantum of the above (src/backends/qnnpack/graph_ops.cc documents each).
 * An ADD whose one input a CONV2D makes for it alone and whose other input
 * is dead after it may run inside that convolution (the backend's sum: the
 * convolution adds into the other input's buffer); in u8 the convolution's
 * own output is then not rounded, which is done only where that moves the
 * add's result by at most one quantum (the convolution's scale at most twice
 * the add's); qpack_graph_node_backend names the convolution, and
 * QPACK_GRAPH_FUSE_ADD=0 in the environment keeps every add apart.
 *
 * Threads: runs take no lock; each call has its own workspace (buffers
 * planned by liveness). Plans are cached per input shape (8 at most).
 */

typedef struct qpack_graph qpack_graph;

typedef enum qpack_dtype {
  QPACK_DTYPE_F32 = 0,
  QPACK_DTYPE_U8 = 1,
} qpack_dtype;

typedef enum qpack_node_kind {
  QPACK_NODE_CONV2D = 0,         /* conv: x [N, C, H, W] -> y, or [N, C, L] for a kernel of
                                    height 1 (conv1d); dtype by the conv's mode */
  QPACK_NODE_LINEAR = 1,         /* linear over the last dim of a rank-2 or rank-3 value; with
                                    ceil_mode = 1 over the channels of each pixel of a rank-4
                                    value (a Linear between permutes to and from NHWC) */
  QPACK_NODE_ADD = 2,            /* inputs[0] + inputs[1] (same shape), then `activation` */
  QPACK_NODE_MAXPOOL2D = 3,      /* u8: output qparams = input qparams */
  QPACK_NODE_AVGPOOL2D = 4,
  QPACK_NODE_GLOBAL_AVGPOOL = 5, /* mean over H, W (or L): [N, C, 1, 1] / [N, C, 1] (keepdim)
                                    or [N, C] */
  QPACK_NODE_FLATTEN = 6,        /* dims 1.. into one (NCHW order); u8 qparams kept */
  QPACK_NODE_CONCAT = 7,         /* along dim 1; u8 inputs requantized to the output's qparams */
  QPACK_NODE_ACTIVATION = 8,     /* elementwise `activation` */
  QPACK_NODE_AFFINE = 9,         /* x * scale[c] + shift[c] along dim 1 (unfolded BatchNorm), or
                                    along the last dim when kernel_h = -1 (a layer scale on tokens);
                                    one scale and shift (channels = 1) apply to every value */
  QPACK_NODE_QUANTIZE = 10,      /* f32 -> u8 with the output value's qparams */
  QPACK_NODE_DEQUANTIZE = 11,    /* u8 -> f32 */
  QPACK_NODE_MUL = 12,           /* inputs[0] * inputs[1]: equal shapes, or inputs[1]
                                    [N, C, 1, 1] scaling each channel (squeeze-excitation) */
  QPACK_NODE_CHANNELS = 13,      /* channels along dim 1: part kernel_w of kernel_h equal parts
                                    (torch.chunk; C divisible), then a channel shuffle in
                                    stride_h groups (ShuffleNet): y[:, j] = part[:, (j % g) *
                                    (P / g) + j / g]; u8 qparams kept */
  QPACK_NODE_ADAPTIVE_AVGPOOL2D = 14, /* [N, C, H, W] -> [N, C, kernel_h, kernel_w]: PyTorch's
                                    adaptive windows [floor(i H / OH), ceil((i + 1) H / OH)) */
  QPACK_NODE_PRELU = 15,         /* x > 0 ? x : slope[c] x along dim 1 (nn.PReLU): `channels`
                                    slopes at affine_scale (1: one for every channel), copied */
  /* Resize of [N, C, H, W] to [N, C, OH, OW] as F.interpolate: OH, OW = kernel_h, kernel_w
   * (both >= 1), or with both 0 floor(H * act_min), floor(W * act_max) for scale factors
   * act_min, act_max (> 0), or with a second input the H, W of inputs[1] (its data is not read).
   * Scale factors also map coordinates as PyTorch's scale_factor does (source = dst / scale);
   * otherwise (act_min = act_max = 0) by in / out. */
  QPACK_NODE_RESIZE_NEAREST = 16,  /* source index floor(dst * in / out), clamped to in - 1;
                                    u8 qparams kept */
  QPACK_NODE_RESIZE_BILINEAR = 17, /* ceil_mode = align_corners: (dst + 0.5) in / out - 0.5
                                    (clamped at 0) when 0, dst (in - 1) / (out - 1) when 1 */
  QPACK_NODE_CHANNEL_RANGE = 18, /* channels [kernel_h, kernel_h + kernel_w) along dim 1
                                    (x[:, a:b], torch.split); u8 qparams kept */
  QPACK_NODE_LAYER_NORM = 19,    /* (x - mean) / sqrt(var + eps) * scale[i] + shift[i] along one
                                    dim: kernel_h = 1 (dim 1: a rank-4 value's channels, timm's
                                    LayerNorm2d) or -1 (the last dim: nn.LayerNorm of one dim);
                                    var is the biased one; `channels` values at affine_scale and
                                    affine_shift, copied; eps = act_min (> 0). kernel_h = 0:
                                    GroupNorm, dim 1's channels in kernel_w groups (dividing
                                    them), each normalized over its channels and every
                                    spatial position of its sample (nn.GroupNorm) */
  QPACK_NODE_TRANSPOSE = 20,     /* [N, A, B] -> [N, B, A] (x.transpose(1, 2) of a rank-3 value:
                                    a Conv1d's [N, C, L] as the [N, L, C] rows a Linear reads);
                                    of a rank-4 value [N, C, H, W] -> its tokens [N, H W, C]
                                    (x.flatten(2).transpose(1, 2)); with a second, rank-4 input
                                    (only its H and W read) tokens [N, H W, C] -> the image
                                    [N, C, H, W]; u8 qparams kept */
  QPACK_NODE_DEPTH_TO_SPACE = 21, /* [N, kh kw C, H, W] -> [N, C, H kh, W kw] (kernel_h = kh,
                                    kernel_w = kw >= 1): y[:, c, i kh + a, j kw + b] =
                                    x[:, (a kw + b) C + c, i, j] (channel blocks by position; a
                                    ConvTranspose2d whose stride is its kernel is a 1x1
                                    convolution and this), or with ceil_mode = 1 PyTorch's
                                    pixel_shuffle order x[:, c kh kw + a kw + b, i, j]; u8 qparams
                                    kept */
  QPACK_NODE_ATTENTION = 22,     /* multi-head scaled dot-product attention over rank-3 row-major
                                    values: inputs q [N, L, Cq], k [N, S, Ck], v [N, S, Cv] (one
                                    value may be given for several: a packed qkv projection).
                                    kernel_h = heads H, kernel_w = head dim D of q and k,
                                    stride_h = head dim Dv of v; head h of q is last-dim elements
                                    [pad_top + h D, pad_top + (h + 1) D), of k from pad_left, of v
                                    from pad_bottom; with stride_w > 0 q's and k's heads start
                                    stride_w apart (not D: heads in groups, LeViT's), with
                                    pad_right > 0 v's pad_right apart (not Dv); pad_right = -1:
                                    k and v hold one head that every q head reads (multi-query
                                    attention, MobileNetV4's).
                                    y [N, L, H Dv], head h at [h Dv, (h + 1) Dv):
                                    softmax(act_min q k^T + mask) v (act_min: the scale), with
                                    ceil_mode = 1 row i sees keys j <= i (is_causal). mask:
                                    `channels` floats at affine_scale, [L][S] for every head,
                                    [H][L][S], or [G][H][L][S] with sample n reading group n % G
                                    (G divides N), copied; none with channels = 0. With act_max =
                                    G >= 1 (a whole number <= 2^20): [H][L][S] for the heads, then
                                    [G][L][S] window masks, sample n adding window n % G's after
                                    its head's (Swin's position bias and shifted windows' masks,
                                    each held once). u8: inputs
                                    dequantized, the output quantized to its value's qparams */
  QPACK_NODE_CONSTANT = 23,      /* a constant over the batch of inputs[0] (only its dim 0 read):
                                    y [N, kernel_h, kernel_w] row-major (rank 2 [N, kernel_h]
                                    with kernel_w = 0), every sample the `channels` = kernel_h
                                    max(kernel_w, 1) floats at affine_scale, copied (ViT's class
                                    token expanded over the batch, its position embedding);
                                    u8: those floats quantized to the output value's qparams when
                                    the graph is created (round half to even, clamped) */
  QPACK_NODE_PAD = 24,           /* [N, C, H, W] -> [N, C, pad_top + H + pad_bottom, pad_left + W +
                                    pad_right] (F.pad of an image, nn.ZeroPad2d): the border
                                    act_min (finite); u8: the border act_min quantized to the
                                    output's qparams, the image requantized to them where they
                                    differ from the input's; pads in [0, 2^20] */
  QPACK_NODE_PERMUTE_ROWS = 25,  /* the input's rows of C values (a rank-4 [N, C, H, W] value's
                                    pixels, a rank-3 [N, L, C] value's rows: T = numel / C rows)
                                    reordered in blocks of R: row b R + i of y is row b R + p[i]
                                    of x, p the `channels` = R floats at affine_scale (a
                                    permutation of 0 .. R - 1, copied; R divides T). y is
                                    [T / kernel_h, kernel_h, C] with kernel_w = 0, else the
                                    image [T / (kernel_h kernel_w), C, kernel_h, kernel_w] (rows
                                    as its NHWC pixels): MobileViT's unfold of an image into
                                    patches and its fold back; u8 qparams kept */
} qpack_node_kind;

typedef enum qpack_activation {
  QPACK_ACT_NONE = 0,
  QPACK_ACT_RELU = 1,
  QPACK_ACT_CLAMP = 2,     /* [act_min, act_max]: ReLU6, Hardtanh */
  QPACK_ACT_HARDSWISH = 3,
  QPACK_ACT_SIGMOID = 4,
  QPACK_ACT_GELU = 5,      /* erf form */
  QPACK_ACT_SILU = 6,
  QPACK_ACT_HARDSIGMOID = 7, /* relu6(x + 3) / 6 */
  QPACK_ACT_LEAKY_RELU = 8, /* x > 0 ? x : act_min x (act_min: negative_slope, finite) */
  QPACK_ACT_TANH = 9,
} qpack_activation;

typedef struct qpack_graph_value {
  qpack_dtype dtype;
  float scale;            /* U8 */
  int32_t zero_point;     /* U8, in [0, 255] */
} qpack_graph_value;

typedef struct qpack_graph_node {
  qpack_node_kind kind;
  int32_t inputs[8];      /* value indices */
  int32_t num_inputs;
  int32_t output;         /* value index, produced by this node only */
  const qpack_conv2d* conv;     /* CONV2D */
  const qpack_linear* linear;   /* LINEAR */
  int64_t kernel_h, kernel_w, stride_h, stride_w;            /* pools; CHANNELS; RESIZE_* */
  int64_t pad_top, pad_left, pad_bottom, pad_right;          /* pools */
  int ceil_mode;                /* pools; RESIZE_BILINEAR: align_corners */
  int count_include_pad;        /* AVGPOOL2D */
  int keepdim;                  /* GLOBAL_AVGPOOL */
  qpack_activation activation;  /* ACTIVATION, ADD; CONV2D with an f32 output: applied after the
                                   layer's own, as the backend's post-op (oneDNN's eltwise) */
  float act_min, act_max;       /* QPACK_ACT_CLAMP; LEAKY_RELU: act_min; RESIZE_*: scales */
  const float* affine_scale;    /* AFFINE, LAYER_NORM: [channels], copied; PRELU: the slopes */
  const float* affine_shift;
  int64_t channels;
} qpack_graph_node;

typedef struct qpack_graph_params {
  int32_t num_values;
  const qpack_graph_value* values;
  int32_t num_nodes;
  const qpack_graph_node* nodes;   /* in an order where every input is produced first */
  int32_t num_inputs;
  const int32_t* inputs;           /* value indices fed by the caller */
  int32_t num_outputs;
  const int32_t* outputs;
} qpack_graph_params;

/* A tensor crossing the graph's edges. dims are logical ([N, C, H, W] for
 * rank 4 whatever the layout); layout is the memory order of rank-4 data. */
typedef struct qpack_tensor {
  qpack_dtype dtype;
  int32_t ndim;           /* 1..4 */
  int64_t dims[4];
  qpack_layout layout;    /* rank 4: NCHW or NHWC; ignored otherwise (row-major) */
  void* data;
} qpack_tensor;

typedef struct qpack_graph_info {
  int32_t num_values, num_nodes, num_inputs, num_outputs;
  int closed;
  size_t nbytes_packed;     /* packed bytes of the distinct ops the graph holds */
  size_t nbytes_workspace;  /* workspace of the largest plan made so far */
  uint64_t plans_built;
  uint64_t runs;
  size_t nbytes_constants;  /* what the nodes copied at creation: LayerNorm and affine parameters,
                               PReLU slopes, attention masks, constants' tables (f32 and u8) and
                               u8 lookup tables */
} qpack_graph_info;

/* Validates the graph (types, node parameters, that every value is produced
 * once before use) and takes references to its packed ops. */
QPACK_API qpack_status qpack_graph_create(const qpack_graph_params* params,
                                          qpack_graph** graph_out);
QPACK_API void qpack_graph_destroy(qpack_graph* graph);
/* Releases the graph's references at once (or when in-flight runs end);
 * later calls fail with QPACK_STATUS_CLOSED. Idempotent. */
QPACK_API qpack_status qpack_graph_close(qpack_graph* graph);
/* Plans for these inputs (dtype, ndim, dims, layout; data unused) and fills
 * each output's dtype, ndim and dims. */
QPACK_API qpack_status qpack_graph_output_shapes(const qpack_graph* graph, int32_t num_inputs,
                                                 const qpack_tensor* inputs, int32_t num_outputs,
                                                 qpack_tensor* outputs);
/* Runs the graph: inputs as described; outputs with data, dtype, ndim and
 * dims as qpack_graph_output_shapes gives them, and the layout wanted. */
QPACK_API qpack_status qpack_graph_run(const qpack_graph* graph, int32_t num_inputs,
                                       const qpack_tensor* inputs, int32_t num_outputs,
                                       qpack_tensor* outputs);
/* Works on a closed graph too (closed = 1, every other field 0). */
QPACK_API qpack_status qpack_graph_get_info(const qpack_graph* graph, qpack_graph_info* info_out);
/* Where node `index` runs, NUL-terminated in buf (truncated to size - 1):
 * "qnnpack" or "onednn" (a conv/linear's packed kernels; for the u8 add,
 * pooling, clamp, sigmoid and hardswish nodes of a graph whose static int8
 * ops run on QNNPACK, QNNPACK's own operators where it takes the node's
 * parameters), or "qpack" (qpack's C++ code). A node QNNPACK takes for some
 * of the input shapes planned so far reads "qnnpack, qpack for some shapes".
 * QPACK_GRAPH_BACKEND_OPS=0 in the environment at graph creation keeps every
 * such node in qpack's C++ code. An ADD run inside a convolution reads
 * "onednn (sum post-op of node K)" (K: the convolution's index; ", qpack for
 * some shapes" after it where some plans keep it apart): 128 bytes hold
 * every answer. */
QPACK_API qpack_status qpack_graph_node_backend(const qpack_graph* graph, int32_t index, char* buf,
                                                size_t size);

/* How value `index` is held in the plans built so far (one per input shape
 * run or planned): "NHWC" or "NCHW" for rank 4 (NCHW: an input read where
 * it is, a planar convolution's output), "NLC" for a rank-3 [N, C, L] held
 * channels-last between 1-D convolutions, "row-major" for the rest; plans
 * that differ give both, "/"-separated in the order met; "unplanned" before
 * any plan. 32 bytes hold every answer. */
QPACK_API qpack_status qpack_graph_value_layout(const qpack_graph* graph, int32_t index, char* buf,
                                                size_t size);

/* ---- packed model files (.qpk) -------------------------------------- */
/*
 * A file of packed ops (qpack_linear, qpack_conv2d), frozen graphs over them
 * and an opaque host section (docs/FORMAT.md gives every byte). Saving
 * writes a temporary file in the same folder and renames it over `path`, so
 * a process that mapped the old file keeps reading the old bytes.
 *
 * Loading maps the file read-only (shared page cache across processes) and
 * uses each op's packed bytes in place when they are in the layout this
 * machine's kernels want; otherwise the weight is decoded from the packed
 * bytes and re-packed (qpack_model_info.num_repacked; qpack_model_repacked
 * says why), or, with `strict`, the load fails. A corrupt, truncated or
 * foreign file fails with QPACK_STATUS_FILE_FORMAT and a message naming what
 * failed; every offset and size is checked before it is read.
 *
 * Ops are numbered by their order in the file: those given to save first
 * (linears, then convs), then the ops of the graphs not among them.
 */

typedef struct qpack_model qpack_model;

typedef struct qpack_save_params {
  int32_t num_linears;
  const qpack_linear* const* linears;
  int32_t num_convs;
  const qpack_conv2d* const* convs;
  int32_t num_graphs;
  const qpack_graph* const* graphs;
  const void* host_data;   /* opaque bytes for the embedding language; NULL for none */
  size_t host_size;
  int with_originals;      /* also store the original weights of ops that hold them */
  int32_t num_data;        /* large arrays of the embedding language (Python: tensor
                              storages), each 64-byte aligned in the file */
  const void* const* data;
  const size_t* data_sizes;
} qpack_save_params;

typedef struct qpack_load_options {
  int map;     /* 1: mmap the file (default); 0: read it into memory */
  int verify;  /* 1: check every section's checksum (default) */
  int strict;  /* 1: fail instead of re-packing an op packed for another layout */
} qpack_load_options;

typedef enum qpack_op_kind {
  QPACK_OP_LINEAR = 0,
  QPACK_OP_CONV2D = 1,
} qpack_op_kind;

typedef struct qpack_model_info {
  int32_t num_ops, num_graphs;
  int32_t num_repacked;      /* ops re-packed because their layout differed */
  int mapped;                /* the packed bytes live in a mapping of the file */
  size_t file_size;
  size_t nbytes_in_place;    /* packed bytes used from the file as they are */
  size_t host_size;
  int32_t num_data;
} qpack_model_info;

/* Defaults: map = 1, verify = 1, strict = 0. */
QPACK_API void qpack_load_options_init(qpack_load_options* options);
QPACK_API qpack_status qpack_model_save(const qpack_save_params* params, const char* path);
/* options may be NULL (defaults). */
QPACK_API qpack_status qpack_model_load(const char* path, const qpack_load_options* options,
                                        qpack_model** model_out);
/* The same from an open file descriptor (left open; `name` names it in
 * messages), so that the caller maps the very file the core read. */
QPACK_API qpack_status qpack_model_load_fd(int fd, const char* name,
                                           const qpack_load_options* options,
                                           qpack_model** model_out);
/* The loaded ops and graphs live on while any handle to them does. */
QPACK_API void qpack_model_destroy(qpack_model* model);
QPACK_API qpack_status qpack_model_get_info(const qpack_model* model, qpack_model_info* info_out);
QPACK_API qpack_status qpack_model_op_kind(const qpack_model* model, int32_t index,
                                           qpack_op_kind* kind_out);
/* New handles over op `index` / graph `index` (destroy each when done). */
QPACK_API qpack_status qpack_model_linear(const qpack_model* model, int32_t index,
                                          qpack_linear** linear_out);
QPACK_API qpack_status qpack_model_conv2d(const qpack_model* model, int32_t index,
                                          qpack_conv2d** conv_out);
QPACK_API qpack_status qpack_model_graph(const qpack_model* model, int32_t index,
                                         qpack_graph** graph_out);
/* The host section's bytes (valid while the model lives); NULL and 0 when none. */
QPACK_API qpack_status qpack_model_host(const qpack_model* model, const void** data_out,
                                        size_t* size_out);
/* DATA section `index`: its bytes (valid while the model lives) and offset in the file. */
QPACK_API qpack_status qpack_model_data(const qpack_model* model, int32_t index,
                                        const void** data_out, size_t* size_out,
                                        uint64_t* offset_out);
/* Why the index-th re-packed op was re-packed (NUL-terminated into buf). */
QPACK_API qpack_status qpack_model_repacked(const qpack_model* model, int32_t index, char* buf,
                                            size_t size);

/* One object per file: save it alone, or load a file's only op / first graph. */
QPACK_API qpack_status qpack_linear_save(const qpack_linear* linear, const char* path);
QPACK_API qpack_status qpack_conv2d_save(const qpack_conv2d* conv, const char* path);
QPACK_API qpack_status qpack_graph_save(const qpack_graph* graph, const char* path);
QPACK_API qpack_status qpack_linear_load(const char* path, const qpack_load_options* options,
                                         qpack_linear** linear_out);
QPACK_API qpack_status qpack_conv2d_load(const char* path, const qpack_load_options* options,
                                         qpack_conv2d** conv_out);
QPACK_API qpack_status qpack_graph_load(const char* path, const qpack_load_options* options,
                                        qpack_graph** graph_out);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* QPACK_QPACK_H_ */
