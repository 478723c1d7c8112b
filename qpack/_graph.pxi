# GraphHandle: owns one qpack_graph (included by _core.pyx).
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer
from libc.stdlib cimport calloc, free

NODE_KINDS = {"conv2d": QPACK_NODE_CONV2D, "linear": QPACK_NODE_LINEAR, "add": QPACK_NODE_ADD,
              "maxpool2d": QPACK_NODE_MAXPOOL2D, "avgpool2d": QPACK_NODE_AVGPOOL2D,
              "global_avgpool": QPACK_NODE_GLOBAL_AVGPOOL, "flatten": QPACK_NODE_FLATTEN,
              "concat": QPACK_NODE_CONCAT, "activation": QPACK_NODE_ACTIVATION,
              "affine": QPACK_NODE_AFFINE, "quantize": QPACK_NODE_QUANTIZE,
              "dequantize": QPACK_NODE_DEQUANTIZE, "mul": QPACK_NODE_MUL,
              "channels": QPACK_NODE_CHANNELS, "adaptive_avgpool2d": QPACK_NODE_ADAPTIVE_AVGPOOL2D,
              "prelu": QPACK_NODE_PRELU, "resize_nearest": QPACK_NODE_RESIZE_NEAREST,
              "resize_bilinear": QPACK_NODE_RESIZE_BILINEAR, "channel_range": QPACK_NODE_CHANNEL_RANGE,
              "layer_norm": QPACK_NODE_LAYER_NORM, "transpose": QPACK_NODE_TRANSPOSE,
              "depth_to_space": QPACK_NODE_DEPTH_TO_SPACE, "attention": QPACK_NODE_ATTENTION,
              "constant": QPACK_NODE_CONSTANT, "pad": QPACK_NODE_PAD, "permute_rows": QPACK_NODE_PERMUTE_ROWS}
ACTIVATIONS = {None: QPACK_ACT_NONE, "relu": QPACK_ACT_RELU, "clamp": QPACK_ACT_CLAMP,
               "hardswish": QPACK_ACT_HARDSWISH, "sigmoid": QPACK_ACT_SIGMOID,
               "gelu": QPACK_ACT_GELU, "silu": QPACK_ACT_SILU, "hardsigmoid": QPACK_ACT_HARDSIGMOID,
               "leaky_relu": QPACK_ACT_LEAKY_RELU, "tanh": QPACK_ACT_TANH}
DTYPES = {"f32": QPACK_DTYPE_F32, "u8": QPACK_DTYPE_U8}


cdef int _fill_tensor(qpack_tensor* t, a, str layout) except -1:
    """An input array (C-contiguous, physical order) as a qpack_tensor; for
    layout 'nhwc' a rank-4 array is [N, H, W, C]."""
    if a.dtype == np.float32:
        t.dtype = QPACK_DTYPE_F32
    elif a.dtype == np.uint8:
        t.dtype = QPACK_DTYPE_U8
    else:
        raise InvalidTypeError(f"graph inputs must be float32 or uint8, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise InvalidArgumentError("graph inputs must be C-contiguous")
    if a.ndim < 1 or a.ndim > 4:
        raise InvalidArgumentError(f"graph inputs must have 1 to 4 dims, got {a.ndim}")
    t.ndim = a.ndim
    dims = a.shape
    if a.ndim == 4 and layout == "nhwc":
        dims = (a.shape[0], a.shape[3], a.shape[1], a.shape[2])
    for i in range(a.ndim):
        t.dims[i] = dims[i]
    t.layout = QPACK_LAYOUT_NHWC if layout == "nhwc" else QPACK_LAYOUT_NCHW
    t.data = _data(a)
    return 0


cdef void* _data(a) except? NULL:
    """The first byte of C-contiguous array a (NULL when it has none); the
    buffer protocol, a tenth of the time of a typed memoryview over a byte view."""
    cdef Py_buffer buf
    PyObject_GetBuffer(a, &buf, PyBUF_C_CONTIGUOUS)
    cdef void* p = buf.buf if buf.len > 0 else NULL
    PyBuffer_Release(&buf)
    return p


cdef class GraphHandle:
    """Owns one qpack_graph.

    values: [(dtype 'f32'|'u8', scale, zero_point)]; nodes: [dict(kind=..., inputs=[...],
    output=..., op=LinearHandle|Conv2dHandle, kernel=(h, w), stride=(h, w),
    padding=(t, l, b, r), ceil_mode, count_include_pad, keepdim, activation,
    act_min, act_max, scale, shift, slopes)]; inputs / outputs: value indices.
    leaky_relu: act_min = negative slope; prelu: slopes (1 or C); layer_norm: weight,
    bias (C each), eps and dim (1 or -1, the last) or groups (GroupNorm over dim 1's
    channels in that many groups and every spatial position); affine: scale, shift and dim (1, or
    -1: the last); linear: per_pixel (over the
    channels of a rank-4 value); resize_nearest /
    resize_bilinear: size=(h, w) or scale=(h, w) (or a second input whose H, W
    are taken), align_corners (bilinear); attention: heads, head_dim, value_dim (head_dim when
    absent), offsets=(q, k, v) (where each starts in its input's rows), head_strides=(q and k,
    v) (from one head to the next: head_dim, value_dim when absent), scale, causal, mask
    ([L, S] or [H, L, S] floats, added to the scaled scores); constant: table ([rows] or
    [rows, columns] floats, every sample of the output: inputs[0] gives the batch); pad:
    padding=(t, l, b, r) and act_min (the border's value)."""
    cdef qpack_graph* _h
    cdef readonly int num_inputs
    cdef readonly int num_outputs

    def __cinit__(self, values, nodes, inputs, outputs):
        self._h = NULL
        cdef qpack_graph_params p
        cdef int nv = len(values), nn = len(nodes)
        cdef qpack_graph_value* cv = <qpack_graph_value*>calloc(max(nv, 1), sizeof(qpack_graph_value))
        cdef qpack_graph_node* cn = <qpack_graph_node*>calloc(max(nn, 1), sizeof(qpack_graph_node))
        cdef int32_t[::1] ins = np.ascontiguousarray(inputs, dtype=np.int32)
        cdef int32_t[::1] outs = np.ascontiguousarray(outputs, dtype=np.int32)
        cdef float[::1] fview
        keep = []
        cdef qpack_graph* h = NULL
        cdef qpack_status st
        try:
            for i, (dt, scale, zp) in enumerate(values):
                cv[i].dtype = DTYPES[dt]
                cv[i].scale = scale
                cv[i].zero_point = zp
            for i, n in enumerate(nodes):
                cn[i].kind = NODE_KINDS[n["kind"]]
                node_inputs = n["inputs"]
                if len(node_inputs) > 8:
                    raise InvalidArgumentError("a graph node takes at most 8 inputs")
                cn[i].num_inputs = len(node_inputs)
                for j, v in enumerate(node_inputs):
                    cn[i].inputs[j] = v
                cn[i].output = n["output"]
                op = n.get("op")
                if isinstance(op, Conv2dHandle):
                    cn[i].conv = (<Conv2dHandle>op)._h
                elif isinstance(op, LinearHandle):
                    cn[i].linear = (<LinearHandle>op)._h
                cn[i].kernel_h, cn[i].kernel_w = n.get("size", (0, 0)) if n["kind"].startswith("resize") \
                    else n.get("kernel", (1, 1))
                cn[i].stride_h, cn[i].stride_w = n.get("stride", (1, 1))
                cn[i].pad_top, cn[i].pad_left, cn[i].pad_bottom, cn[i].pad_right = n.get("padding", (0, 0, 0, 0))
                cn[i].ceil_mode = bool(n.get("align_corners" if n["kind"].startswith("resize") else
                                             "per_pixel" if n["kind"] == "linear" else "ceil_mode", False))
                cn[i].count_include_pad = bool(n.get("count_include_pad", True))
                cn[i].keepdim = bool(n.get("keepdim", True))
                cn[i].activation = ACTIVATIONS[n.get("activation")]
                cn[i].act_min, cn[i].act_max = n.get("scale", (0.0, 0.0)) if n["kind"].startswith("resize") \
                    else (n.get("act_min", 0.0), n.get("act_max", 0.0))
                if n["kind"] in ("affine", "layer_norm"):
                    norm = n["kind"] == "layer_norm"
                    sc = np.ascontiguousarray(n["weight" if norm else "scale"], dtype=np.float32)
                    sh = np.ascontiguousarray(n["bias" if norm else "shift"], dtype=np.float32)
                    if sc.shape != sh.shape or sc.ndim != 1 or sc.shape[0] == 0:
                        raise InvalidArgumentError(f"{n['kind']} " + ("weight and bias" if norm else "scale and shift")
                                                   + " must be 1-D of one length")
                    if norm:
                        cn[i].act_min = n.get("eps", 1e-5)
                        cn[i].kernel_h, cn[i].kernel_w = (0, n["groups"]) if "groups" in n else (n.get("dim", -1), 1)
                    else:
                        cn[i].kernel_h, cn[i].kernel_w = n.get("dim", 1), 1
                    keep += [sc, sh]
                    fview = sc
                    cn[i].affine_scale = &fview[0]
                    fview = sh
                    cn[i].affine_shift = &fview[0]
                    cn[i].channels = sc.shape[0]
                elif n["kind"] == "attention":
                    d = n["head_dim"]
                    dv = n.get("value_dim", d)
                    cn[i].kernel_h, cn[i].kernel_w, cn[i].stride_h = n["heads"], d, dv
                    cn[i].pad_top, cn[i].pad_left, cn[i].pad_bottom = n.get("offsets", (0, 0, 0))
                    # where each next head starts: q's and k's (stride_w), v's (pad_right)
                    cn[i].stride_w, cn[i].pad_right = n.get("head_strides", (d, dv))
                    if n.get("multi_query"):  # k and v one head that every q head reads
                        cn[i].pad_right = -1
                    cn[i].act_min = n["scale"] if "scale" in n else 1.0 / d ** 0.5 if d > 0 else 1.0
                    cn[i].ceil_mode = bool(n.get("causal", False))
                    if n.get("mask") is not None:
                        sc = np.ascontiguousarray(n["mask"], dtype=np.float32).reshape(-1)
                        if sc.shape[0] == 0:
                            raise InvalidArgumentError("an attention mask must hold values ([L, S] or [H, L, S])")
                        keep.append(sc)
                        fview = sc
                        cn[i].affine_scale = &fview[0]
                        cn[i].channels = sc.shape[0]
                        # window masks [G, L, S] after the heads' [H, L, S] in "mask"
                        cn[i].act_max = n.get("mask_windows", 0)
                elif n["kind"] == "constant":
                    sc = np.ascontiguousarray(n["table"], dtype=np.float32)
                    if sc.ndim not in (1, 2) or sc.size == 0:
                        raise InvalidArgumentError("a constant's table must be [rows] or [rows, columns], not empty")
                    cn[i].kernel_h, cn[i].kernel_w = sc.shape[0], sc.shape[1] if sc.ndim == 2 else 0
                    sc = sc.reshape(-1)
                    keep.append(sc)
                    fview = sc
                    cn[i].affine_scale = &fview[0]
                    cn[i].channels = sc.shape[0]
                elif n["kind"] == "permute_rows":
                    sc = np.ascontiguousarray(n["rows"], dtype=np.float32)
                    if sc.ndim != 1 or sc.shape[0] == 0:
                        raise InvalidArgumentError("permute_rows needs its permutation as 1-D rows, not empty")
                    cn[i].kernel_h, cn[i].kernel_w = n["kernel"]
                    keep.append(sc)
                    fview = sc
                    cn[i].affine_scale = &fview[0]
                    cn[i].channels = sc.shape[0]
                elif n["kind"] == "prelu":
                    sc = np.ascontiguousarray(n["slopes"], dtype=np.float32)
                    if sc.ndim != 1 or sc.shape[0] == 0:
                        raise InvalidArgumentError("prelu slopes must be 1-D with 1 or C values")
                    keep.append(sc)
                    fview = sc
                    cn[i].affine_scale = &fview[0]
                    cn[i].channels = sc.shape[0]
            p.num_values = nv
            p.values = cv
            p.num_nodes = nn
            p.nodes = cn
            p.num_inputs = ins.shape[0]
            p.inputs = &ins[0] if ins.shape[0] > 0 else NULL
            p.num_outputs = outs.shape[0]
            p.outputs = &outs[0] if outs.shape[0] > 0 else NULL
            with nogil:
                st = qpack_graph_create(&p, &h)
            check_status(st)
        finally:
            free(cv)
            free(cn)
        self._h = h
        self.num_inputs = ins.shape[0]
        self.num_outputs = outs.shape[0]

    def __dealloc__(self):
        if self._h != NULL:
            qpack_graph_destroy(self._h)
            self._h = NULL

    def run(self, arrays, layouts, out_layout="nhwc"):
        """arrays: C-contiguous inputs (physical order), layouts: 'nchw'|'nhwc' each.
        Returns the outputs; rank-4 ones as physical NHWC arrays [N, H, W, C]
        (out_layout 'nhwc') or as NCHW arrays [N, C, H, W] ('nchw')."""
        if out_layout not in ("nchw", "nhwc"):
            raise InvalidArgumentError(f"out_layout must be 'nchw' or 'nhwc', got {out_layout!r}")
        cdef int ni = len(arrays), no = self.num_outputs
        if ni != self.num_inputs:
            raise InvalidArgumentError(f"this graph takes {self.num_inputs} input(s), got {ni}")
        cdef qpack_tensor* ti = <qpack_tensor*>calloc(max(ni, 1), sizeof(qpack_tensor))
        cdef qpack_tensor* to = <qpack_tensor*>calloc(max(no, 1), sizeof(qpack_tensor))
        cdef qpack_status st
        results = []
        try:
            for i in range(ni):
                _fill_tensor(&ti[i], arrays[i], layouts[i])
            check_status(qpack_graph_output_shapes(self._h, ni, ti, no, to))
            for i in range(no):
                dims = [to[i].dims[a] for a in range(to[i].ndim)]
                dtype = np.float32 if to[i].dtype == QPACK_DTYPE_F32 else np.uint8
                if to[i].ndim == 4 and out_layout == "nhwc":
                    out = np.empty((dims[0], dims[2], dims[3], dims[1]), dtype=dtype)
                    to[i].layout = QPACK_LAYOUT_NHWC
                elif to[i].ndim == 4:
                    out = np.empty(dims, dtype=dtype)
                    to[i].layout = QPACK_LAYOUT_NCHW
                else:
                    out = np.empty(dims, dtype=dtype)
                to[i].data = _data(out)
                results.append(out)
            with nogil:
                st = qpack_graph_run(self._h, ni, ti, no, to)
            check_status(st)
        finally:
            free(ti)
            free(to)
        return results

    def info(self):
        cdef qpack_graph_info i
        check_status(qpack_graph_get_info(self._h, &i))
        return {"closed": bool(i.closed), "num_values": i.num_values, "num_nodes": i.num_nodes,
                "nbytes_packed": i.nbytes_packed, "nbytes_workspace": i.nbytes_workspace,
                "nbytes_constants": i.nbytes_constants,
                "plans_built": i.plans_built, "runs": i.runs}

    def node_backends(self):
        """Where each node runs: "qnnpack", "onednn" or "qpack" (the core's C++ code)."""
        cdef char buf[128]
        out = []
        for i in range(self.info()["num_nodes"]):
            check_status(qpack_graph_node_backend(self._h, i, buf, sizeof(buf)))
            out.append(buf.decode("ascii"))
        return out

    def value_layouts(self):
        """How each value is held in the plans built so far (qpack_graph_value_layout):
        "NHWC", "NCHW", "NLC", "row-major", several "/"-separated, or "unplanned"."""
        cdef char buf[32]
        out = []
        for i in range(self.info()["num_values"]):
            check_status(qpack_graph_value_layout(self._h, i, buf, sizeof(buf)))
            out.append(buf.decode("ascii"))
        return out

    def close(self):
        check_status(qpack_graph_close(self._h))
