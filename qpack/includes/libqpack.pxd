# Extern declarations of libqpack's C API (src/include/qpack/qpack.h), and
# nothing else. Every call may run without the GIL.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

cdef extern from "qpack/qpack.h" nogil:
    ctypedef enum qpack_status:
        QPACK_STATUS_SUCCESS
        QPACK_STATUS_INVALID_ARGUMENT
        QPACK_STATUS_INVALID_TYPE
        QPACK_STATUS_UNSUPPORTED
        QPACK_STATUS_OUT_OF_MEMORY
        QPACK_STATUS_CLOSED
        QPACK_STATUS_BACKEND_ERROR
        QPACK_STATUS_INTERNAL
        QPACK_STATUS_FILE_FORMAT
        QPACK_STATUS_IO

    ctypedef enum qpack_backend:
        QPACK_BACKEND_AUTO
        QPACK_BACKEND_ONEDNN
        QPACK_BACKEND_QNNPACK

    ctypedef enum qpack_mode:
        QPACK_MODE_F32
        QPACK_MODE_INT8_STATIC
        QPACK_MODE_INT8_DYNAMIC

    ctypedef enum qpack_retain:
        QPACK_RETAIN_DEFAULT
        QPACK_RETAIN_RELEASE
        QPACK_RETAIN_KEEP

    const char* qpack_last_error()
    int qpack_get_default_retain()
    void qpack_set_default_retain(int keep)
    int qpack_set_thread_retain(int retain)
    int qpack_get_thread_retain()
    int qpack_resolve_retain(int retain)
    qpack_status qpack_set_num_threads(int num_threads)
    int qpack_get_num_threads()
    int qpack_build_mobile()
    int qpack_in_forked_child()
    const char* qpack_version()
    qpack_status qpack_choose_qparams_u8_max(float min, float max, int32_t qmax, float* scale_out,
                                             int32_t* zero_point_out)
    qpack_status qpack_choose_qparams_u8(float min, float max, float* scale_out,
                                         int32_t* zero_point_out)
    qpack_status qpack_attention_f32(const float* q, const int64_t* q_strides, const float* k,
                                     const int64_t* k_strides, const float* v, const int64_t* v_strides,
                                     float* out, const int64_t* out_strides, int64_t batch, int64_t heads,
                                     int64_t L, int64_t S, int64_t D, float scale, int causal)
    qpack_status qpack_attention_f32_mask(const float* q, const int64_t* q_strides, const float* k,
                                          const int64_t* k_strides, const float* v, const int64_t* v_strides,
                                          const float* mask, const int64_t* mask_strides, float* out,
                                          const int64_t* out_strides, int64_t batch, int64_t heads, int64_t L,
                                          int64_t S, int64_t D, int64_t Dv, float scale, int causal)

    ctypedef struct qpack_backend_info:
        qpack_backend backend
        const char* name
        int compiled
        int available
        int asymmetric_weights
        unsigned linear_modes
        unsigned conv2d_modes
        unsigned graph_nodes
        unsigned graph_activations

    int qpack_backend_count()
    qpack_status qpack_backend_get_info(int index, qpack_backend_info* info_out)
    qpack_status qpack_backend_describe(qpack_backend backend, char* buf, size_t size)
    int qpack_backend_available(qpack_backend backend)
    int qpack_backend_int8_input_max(qpack_backend backend)

    ctypedef struct qpack_op_stats:
        uint64_t states_built
        uint64_t cache_hits
        uint64_t evictions
        uint64_t runs
        uint64_t split_runs

    ctypedef struct qpack_linear:
        pass

    ctypedef struct qpack_linear_params:
        int64_t in_features
        int64_t out_features
        qpack_mode mode
        qpack_backend backend
        int retain
        const void* weight
        const float* weight_scales
        const int32_t* weight_zero_points
        int64_t num_weight_scales
        const float* bias
        float clamp_min
        float clamp_max
        float input_scale
        int32_t input_zero_point
        float output_scale
        int32_t output_zero_point

    ctypedef struct qpack_linear_info:
        int64_t in_features
        int64_t out_features
        qpack_mode mode
        qpack_backend backend
        int has_bias
        int has_original
        int closed
        int64_t num_weight_scales
        size_t nbytes_packed
        size_t nbytes_original

    ctypedef qpack_op_stats qpack_linear_stats

    void qpack_linear_params_init(qpack_linear_params* params)
    qpack_status qpack_linear_create(const qpack_linear_params* params, qpack_linear** linear_out)
    void qpack_linear_destroy(qpack_linear* linear)
    qpack_status qpack_linear_close(qpack_linear* linear)
    qpack_status qpack_linear_run_f32(const qpack_linear* linear, int64_t batch,
                                      const float* x, float* y_out)
    qpack_status qpack_linear_run_u8(const qpack_linear* linear, int64_t batch,
                                     const uint8_t* x, float input_scale,
                                     int32_t input_zero_point, uint8_t* y_out)
    qpack_status qpack_linear_release_original(qpack_linear* linear)
    qpack_status qpack_linear_unpack(const qpack_linear* linear, void* weight_out, float* bias_out)
    qpack_status qpack_linear_get_info(const qpack_linear* linear, qpack_linear_info* info_out)
    qpack_status qpack_linear_get_stats(const qpack_linear* linear, qpack_linear_stats* stats_out)

    # ---- packed conv2d ----
    ctypedef enum qpack_layout:
        QPACK_LAYOUT_NCHW
        QPACK_LAYOUT_NHWC

    ctypedef struct qpack_conv2d:
        pass

    ctypedef struct qpack_conv2d_params:
        int64_t in_channels
        int64_t out_channels
        int64_t groups
        int64_t kernel_h
        int64_t kernel_w
        int64_t stride_h
        int64_t stride_w
        int64_t pad_top
        int64_t pad_left
        int64_t pad_bottom
        int64_t pad_right
        int64_t dilation_h
        int64_t dilation_w
        qpack_mode mode
        qpack_backend backend
        int retain
        const void* weight
        const float* weight_scales
        const int32_t* weight_zero_points
        int64_t num_weight_scales
        const float* bias
        float clamp_min
        float clamp_max
        float input_scale
        int32_t input_zero_point
        float output_scale
        int32_t output_zero_point

    ctypedef struct qpack_conv2d_info:
        int64_t in_channels
        int64_t out_channels
        int64_t groups
        int64_t kernel_h
        int64_t kernel_w
        qpack_mode mode
        qpack_backend backend
        int has_bias
        int has_original
        int closed
        int64_t num_weight_scales
        size_t nbytes_packed
        size_t nbytes_original

    ctypedef qpack_op_stats qpack_conv2d_stats

    void qpack_conv2d_params_init(qpack_conv2d_params* params)
    qpack_status qpack_conv2d_create(const qpack_conv2d_params* params, qpack_conv2d** conv_out)
    void qpack_conv2d_destroy(qpack_conv2d* conv)
    qpack_status qpack_conv2d_close(qpack_conv2d* conv)
    qpack_status qpack_conv2d_output_size(const qpack_conv2d* conv, int64_t height, int64_t width,
                                          int64_t* out_h_out, int64_t* out_w_out)
    qpack_status qpack_conv2d_run_f32(const qpack_conv2d* conv, int64_t batch, int64_t height,
                                      int64_t width, qpack_layout x_layout, const float* x,
                                      qpack_layout y_layout, float* y_out)
    qpack_status qpack_conv2d_run_u8(const qpack_conv2d* conv, int64_t batch, int64_t height,
                                     int64_t width, qpack_layout x_layout, const uint8_t* x,
                                     float input_scale, int32_t input_zero_point,
                                     qpack_layout y_layout, uint8_t* y_out)
    qpack_status qpack_conv2d_release_original(qpack_conv2d* conv)
    qpack_status qpack_conv2d_unpack(const qpack_conv2d* conv, void* weight_out, float* bias_out)
    qpack_status qpack_conv2d_get_info(const qpack_conv2d* conv, qpack_conv2d_info* info_out)
    qpack_status qpack_conv2d_get_stats(const qpack_conv2d* conv, qpack_conv2d_stats* stats_out)

    # ---- frozen graphs ----
    ctypedef struct qpack_graph:
        pass

    ctypedef enum qpack_dtype:
        QPACK_DTYPE_F32
        QPACK_DTYPE_U8

    ctypedef enum qpack_node_kind:
        QPACK_NODE_CONV2D
        QPACK_NODE_LINEAR
        QPACK_NODE_ADD
        QPACK_NODE_MAXPOOL2D
        QPACK_NODE_AVGPOOL2D
        QPACK_NODE_GLOBAL_AVGPOOL
        QPACK_NODE_FLATTEN
        QPACK_NODE_CONCAT
        QPACK_NODE_ACTIVATION
        QPACK_NODE_AFFINE
        QPACK_NODE_QUANTIZE
        QPACK_NODE_DEQUANTIZE
        QPACK_NODE_MUL
        QPACK_NODE_CHANNELS
        QPACK_NODE_ADAPTIVE_AVGPOOL2D
        QPACK_NODE_PRELU
        QPACK_NODE_RESIZE_NEAREST
        QPACK_NODE_RESIZE_BILINEAR
        QPACK_NODE_CHANNEL_RANGE
        QPACK_NODE_LAYER_NORM
        QPACK_NODE_TRANSPOSE
        QPACK_NODE_DEPTH_TO_SPACE
        QPACK_NODE_ATTENTION
        QPACK_NODE_CONSTANT
        QPACK_NODE_PAD
        QPACK_NODE_PERMUTE_ROWS

    ctypedef enum qpack_activation:
        QPACK_ACT_NONE
        QPACK_ACT_RELU
        QPACK_ACT_CLAMP
        QPACK_ACT_HARDSWISH
        QPACK_ACT_SIGMOID
        QPACK_ACT_GELU
        QPACK_ACT_SILU
        QPACK_ACT_HARDSIGMOID
        QPACK_ACT_LEAKY_RELU
        QPACK_ACT_TANH

    ctypedef struct qpack_graph_value:
        qpack_dtype dtype
        float scale
        int32_t zero_point

    ctypedef struct qpack_graph_node:
        qpack_node_kind kind
        int32_t inputs[8]
        int32_t num_inputs
        int32_t output
        const qpack_conv2d* conv
        const qpack_linear* linear
        int64_t kernel_h, kernel_w, stride_h, stride_w
        int64_t pad_top, pad_left, pad_bottom, pad_right
        int ceil_mode
        int count_include_pad
        int keepdim
        qpack_activation activation
        float act_min, act_max
        const float* affine_scale
        const float* affine_shift
        int64_t channels

    ctypedef struct qpack_graph_params:
        int32_t num_values
        const qpack_graph_value* values
        int32_t num_nodes
        const qpack_graph_node* nodes
        int32_t num_inputs
        const int32_t* inputs
        int32_t num_outputs
        const int32_t* outputs

    ctypedef struct qpack_tensor:
        qpack_dtype dtype
        int32_t ndim
        int64_t dims[4]
        qpack_layout layout
        void* data

    ctypedef struct qpack_graph_info:
        int32_t num_values, num_nodes, num_inputs, num_outputs
        int closed
        size_t nbytes_packed
        size_t nbytes_workspace
        uint64_t plans_built
        uint64_t runs
        size_t nbytes_constants

    qpack_status qpack_graph_create(const qpack_graph_params* params, qpack_graph** graph_out)
    void qpack_graph_destroy(qpack_graph* graph)
    qpack_status qpack_graph_close(qpack_graph* graph)
    qpack_status qpack_graph_output_shapes(const qpack_graph* graph, int32_t num_inputs,
                                           const qpack_tensor* inputs, int32_t num_outputs,
                                           qpack_tensor* outputs)
    qpack_status qpack_graph_run(const qpack_graph* graph, int32_t num_inputs,
                                 const qpack_tensor* inputs, int32_t num_outputs,
                                 qpack_tensor* outputs)
    qpack_status qpack_graph_get_info(const qpack_graph* graph, qpack_graph_info* info_out)
    qpack_status qpack_graph_node_backend(const qpack_graph* graph, int32_t index, char* buf, size_t size)
    qpack_status qpack_graph_value_layout(const qpack_graph* graph, int32_t index, char* buf, size_t size)

    # ---- packed model files ----
    ctypedef struct qpack_model:
        pass

    ctypedef struct qpack_save_params:
        int32_t num_linears
        const qpack_linear* const* linears
        int32_t num_convs
        const qpack_conv2d* const* convs
        int32_t num_graphs
        const qpack_graph* const* graphs
        const void* host_data
        size_t host_size
        int with_originals
        int32_t num_data
        const void* const* data
        const size_t* data_sizes

    ctypedef struct qpack_load_options:
        int map
        int verify
        int strict

    ctypedef enum qpack_op_kind:
        QPACK_OP_LINEAR
        QPACK_OP_CONV2D

    ctypedef struct qpack_model_info:
        int32_t num_ops, num_graphs
        int32_t num_repacked
        int mapped
        size_t file_size
        size_t nbytes_in_place
        size_t host_size
        int32_t num_data

    void qpack_load_options_init(qpack_load_options* options)
    qpack_status qpack_model_save(const qpack_save_params* params, const char* path)
    qpack_status qpack_model_load(const char* path, const qpack_load_options* options,
                                  qpack_model** model_out)
    qpack_status qpack_model_load_fd(int fd, const char* name, const qpack_load_options* options,
                                     qpack_model** model_out)
    qpack_status qpack_model_data(const qpack_model* model, int32_t index, const void** data_out,
                                  size_t* size_out, uint64_t* offset_out)
    void qpack_model_destroy(qpack_model* model)
    qpack_status qpack_model_get_info(const qpack_model* model, qpack_model_info* info_out)
    qpack_status qpack_model_op_kind(const qpack_model* model, int32_t index, qpack_op_kind* kind_out)
    qpack_status qpack_model_linear(const qpack_model* model, int32_t index, qpack_linear** out)
    qpack_status qpack_model_conv2d(const qpack_model* model, int32_t index, qpack_conv2d** out)
    qpack_status qpack_model_host(const qpack_model* model, const void** data_out, size_t* size_out)
    qpack_status qpack_model_repacked(const qpack_model* model, int32_t index, char* buf, size_t size)
