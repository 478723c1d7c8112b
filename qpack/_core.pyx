# cython: language_level=3, boundscheck=False, wraparound=False
"""Cython layer of qpack: Python objects over libqpack's C API.

Knows numpy and the buffer protocol, never torch. Arrays arrive translated
(dtype, contiguity: see qpack/_packed.py); values are validated by the core.
The GIL is released for packing, running and unpacking; errors are
translated in _errors.pxi only.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t

import numpy as np

from qpack.includes.libqpack cimport *

include "_errors.pxi"

MODES = {"f32": QPACK_MODE_F32, "int8_static": QPACK_MODE_INT8_STATIC,
         "int8_dynamic": QPACK_MODE_INT8_DYNAMIC}
_MODE_NAMES = {v: k for k, v in MODES.items()}


def get_default_retain():
    return bool(qpack_get_default_retain())


def set_default_retain(keep):
    qpack_set_default_retain(1 if keep else 0)


cdef int _retain_code(retain):
    return QPACK_RETAIN_DEFAULT if retain is None else (
        QPACK_RETAIN_KEEP if retain else QPACK_RETAIN_RELEASE)


def set_thread_retain(retain):
    """retain: True, False or None (clear). Returns the previous override."""
    prev = qpack_set_thread_retain(_retain_code(retain))
    return None if prev == QPACK_RETAIN_DEFAULT else bool(prev)


def get_thread_retain():
    cdef int r = qpack_get_thread_retain()
    return None if r == QPACK_RETAIN_DEFAULT else bool(r)


def resolve_retain(retain):
    return bool(qpack_resolve_retain(_retain_code(retain)))


def set_num_threads(int n):
    check_status(qpack_set_num_threads(n))


def get_num_threads():
    return qpack_get_num_threads()


def build_mobile():
    return bool(qpack_build_mobile())


def in_forked_child():
    return bool(qpack_in_forked_child())


def version():
    return qpack_version().decode("ascii")


def choose_qparams_u8(float lo, float hi, int32_t qmax=255):
    """uint8 (scale, zero_point) for values in [lo, hi] onto [0, qmax], the core's one rule."""
    cdef float scale = 0
    cdef int32_t zp = 0
    check_status(qpack_choose_qparams_u8_max(lo, hi, qmax, &scale, &zp))
    return float(scale), int(zp)


def attention_f32(q, k, v, out, float scale, bint causal=False, mask=None):
    """out = softmax(scale q k^T [+ mask]) v per batch and head (qpack_attention_f32_mask).
    q, k, v, out: float32 numpy arrays [B, H, rows, D] with contiguous rows (any strides
    above; v's and out's rows may have another size Dv than q's and k's); mask: None
    or a float32 array [B, H, L, S] with contiguous rows (strides 0 where it is
    broadcast: np.broadcast_to)."""
    cdef int64_t qs[3], ks[3], vs[3], os_[3], ms[3]
    named = (("q", q), ("k", k), ("v", v), ("out", out)) + ((("mask", mask),) if mask is not None else ())
    for name, a in named:
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 4:
            raise InvalidTypeError(f"attention: {name} must be a 4-d float32 array")
        if a.size > 0 and a.shape[3] > 1 and a.strides[3] != 4:
            raise InvalidTypeError(f"attention: {name}'s rows must be contiguous")
    if not out.flags.writeable:
        raise InvalidArgumentError("attention: out is read-only")
    B, H, L, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    if (k.shape[0], k.shape[1], k.shape[3]) != (B, H, D) or v.shape[:3] != k.shape[:3] or \
            out.shape != (B, H, L, Dv):
        raise InvalidArgumentError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} and out {out.shape} "
                                   f"do not match ([B, H, L, D], [B, H, S, D], [B, H, S, Dv], [B, H, L, Dv])")
    if mask is not None and mask.shape != (B, H, L, S):
        raise InvalidArgumentError(f"attention: mask {mask.shape} must be [B, H, L, S] = {(B, H, L, S)}")
    for i in range(3):
        qs[i] = q.strides[i] // 4
        ks[i] = k.strides[i] // 4
        vs[i] = v.strides[i] // 4
        os_[i] = out.strides[i] // 4
        ms[i] = mask.strides[i] // 4 if mask is not None else 0
    cdef size_t qp = q.__array_interface__["data"][0], kp = k.__array_interface__["data"][0]
    cdef size_t vp = v.__array_interface__["data"][0], op = out.__array_interface__["data"][0]
    cdef size_t mp = mask.__array_interface__["data"][0] if mask is not None else 0
    cdef int64_t b = B, h = H, l = L, s_ = S, d = D, dv = Dv
    cdef qpack_status st
    with nogil:
        st = qpack_attention_f32_mask(<const float*>qp, qs, <const float*>kp, ks, <const float*>vp, vs,
                                      <const float*>mp, ms, <float*>op, os_, b, h, l, s_, d, dv, scale,
                                      1 if causal else 0)
    check_status(st)


def _mode_list(unsigned bits):
    return [name for name, m in MODES.items() if bits & (1u << m)]


def _graph_op_list(unsigned nodes, unsigned acts):
    kinds = {"add": QPACK_NODE_ADD, "maxpool2d": QPACK_NODE_MAXPOOL2D, "avgpool2d": QPACK_NODE_AVGPOOL2D,
             "global_avgpool": QPACK_NODE_GLOBAL_AVGPOOL}
    activations = {"relu": QPACK_ACT_RELU, "clamp": QPACK_ACT_CLAMP, "sigmoid": QPACK_ACT_SIGMOID,
                   "hardswish": QPACK_ACT_HARDSWISH}
    return ([k for k, v in kinds.items() if nodes & (1u << v)] +
            [f"activation:{k}" for k, v in activations.items() if acts & (1u << v)])


def backend_infos():
    """What the core's registry reports for every backend qpack knows, in AUTO order."""
    cdef qpack_backend_info b
    cdef char buf[512]
    out = []
    for i in range(qpack_backend_count()):
        check_status(qpack_backend_get_info(i, &b))
        check_status(qpack_backend_describe(b.backend, buf, sizeof(buf)))
        out.append({"id": int(b.backend), "name": b.name.decode("ascii"),
                    "compiled": bool(b.compiled), "available": bool(b.available),
                    "version": buf.decode("utf-8", "replace"),
                    "asymmetric_weights": bool(b.asymmetric_weights),
                    "int8_input_max": qpack_backend_int8_input_max(b.backend),
                    "linear": _mode_list(b.linear_modes), "conv2d": _mode_list(b.conv2d_modes),
                    "graph_ops": _graph_op_list(b.graph_nodes, b.graph_activations)})
    return out


_BACKENDS = {b["name"]: b["id"] for b in backend_infos()}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}


cdef qpack_backend _backend_code(str backend) except *:
    if backend == "auto":
        return QPACK_BACKEND_AUTO
    if backend not in _BACKENDS:
        names = ", ".join(repr(n) for n in ["auto", *_BACKENDS])
        raise InvalidArgumentError(f"unknown backend {backend!r}; use one of {names}")
    return <qpack_backend>_BACKENDS[backend]


ctypedef fused op_params:
    qpack_linear_params
    qpack_conv2d_params


cdef class _OpArrays:
    """Keeps an op's arrays alive while the core copies what it needs, and
    fills the fields every params struct shares from OpArgs (qpack/_packed.py)."""
    cdef object weight, bias, scales, zero_points
    cdef const uint8_t[::1] wview
    cdef const float[::1] bview
    cdef const float[::1] sview
    cdef const int32_t[::1] zview

    def __cinit__(self, args):
        self.weight = args.weight
        self.wview = self.weight.reshape(-1).view(np.uint8)
        self.bias = args.bias
        if self.bias is not None:
            self.bview = self.bias
        self.scales = args.weight_scales
        if self.scales is not None:
            self.sview = np.ascontiguousarray(self.scales, dtype=np.float32)
        self.zero_points = args.weight_zero_points
        if self.zero_points is not None:
            self.zview = np.ascontiguousarray(self.zero_points, dtype=np.int32)
            if self.scales is None or self.zview.shape[0] != self.sview.shape[0]:
                raise InvalidArgumentError("weight zero points and scales differ in length")


cdef void _fill(op_params* p, _OpArrays a, args, str backend, retain) except *:
    p.mode = MODES[args.mode]
    p.backend = _backend_code(backend)
    p.retain = _retain_code(retain)
    if a.wview.shape[0] > 0:
        p.weight = &a.wview[0]
    if a.bias is not None and a.bview.shape[0] > 0:
        p.bias = &a.bview[0]
    if a.scales is not None:
        p.num_weight_scales = a.sview.shape[0]
        if a.sview.shape[0] > 0:
            p.weight_scales = &a.sview[0]
    if a.zero_points is not None and a.zview.shape[0] > 0:
        p.weight_zero_points = &a.zview[0]
    p.clamp_min, p.clamp_max = args.clamp
    p.input_scale, p.input_zero_point, p.output_scale, p.output_zero_point = args.io


cdef dict _stats(qpack_op_stats s):
    return {"states_built": s.states_built, "cache_hits": s.cache_hits,
            "evictions": s.evictions, "runs": s.runs, "split_runs": s.split_runs}


cdef class LinearHandle:
    """Owns one qpack_linear."""
    cdef qpack_linear* _h
    cdef readonly int64_t in_features
    cdef readonly int64_t out_features
    cdef readonly str mode
    cdef readonly str backend
    cdef readonly bint has_bias

    def __cinit__(self, args=None, str backend="auto", retain=None):
        self._h = NULL
        if args is None:  # adopted: see _adopt_linear
            return
        cdef qpack_linear_params p
        qpack_linear_params_init(&p)
        cdef _OpArrays arrays = _OpArrays(args)
        _fill(&p, arrays, args, backend, retain)
        p.out_features = args.weight.shape[0]
        p.in_features = args.weight.shape[1]
        cdef qpack_status st
        cdef qpack_linear* h = NULL
        with nogil:
            st = qpack_linear_create(&p, &h)
        check_status(st)
        self._h = h
        self.in_features = p.in_features
        self.out_features = p.out_features
        self.mode = args.mode
        self.has_bias = args.bias is not None
        cdef qpack_linear_info info
        check_status(qpack_linear_get_info(self._h, &info))
        self.backend = _BACKEND_NAMES[info.backend]

    def __dealloc__(self):
        if self._h != NULL:
            qpack_linear_destroy(self._h)
            self._h = NULL

    def _checked_rows(self, x):
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise InvalidArgumentError(
                f"input has {x.shape[x.ndim - 1]} features (last dim); this layer takes {self.in_features}")
        return x.shape[0]

    def run_f32(self, x):
        """x: C-contiguous float32 [M, K] -> float32 [M, N]."""
        cdef int64_t m = self._checked_rows(x)
        out = np.empty((m, self.out_features), dtype=np.float32)
        cdef const float[:, ::1] xv = x
        cdef float[:, ::1] yv = out
        cdef const float* xp = &xv[0, 0] if m > 0 else NULL
        cdef float* yp = &yv[0, 0] if m > 0 else NULL
        cdef qpack_status st
        with nogil:
            st = qpack_linear_run_f32(self._h, m, xp, yp)
        check_status(st)
        return out

    def run_u8(self, x, float scale, int zero_point):
        """x: C-contiguous uint8 [M, K] -> uint8 [M, N]."""
        cdef int64_t m = self._checked_rows(x)
        out = np.empty((m, self.out_features), dtype=np.uint8)
        cdef const uint8_t[:, ::1] xv = x
        cdef uint8_t[:, ::1] yv = out
        cdef const uint8_t* xp = &xv[0, 0] if m > 0 else NULL
        cdef uint8_t* yp = &yv[0, 0] if m > 0 else NULL
        cdef qpack_status st
        with nogil:
            st = qpack_linear_run_u8(self._h, m, xp, scale, zero_point, yp)
        check_status(st)
        return out

    def release_original(self):
        check_status(qpack_linear_release_original(self._h))

    def unpack(self):
        dtype = np.float32 if self.mode == "f32" else np.int8
        w = np.empty((self.out_features, self.in_features), dtype=dtype)
        b = np.empty((self.out_features,), dtype=np.float32)
        cdef uint8_t[::1] wv = w.reshape(-1).view(np.uint8)
        cdef float[::1] bv = b
        cdef qpack_status st
        with nogil:
            st = qpack_linear_unpack(self._h, &wv[0], &bv[0])
        check_status(st)
        return w, (b if self.has_bias else None)

    @property
    def closed(self):
        """info()["closed"] without the dict (a frozen layer asks on every call)."""
        cdef qpack_linear_info i
        check_status(qpack_linear_get_info(self._h, &i))
        return bool(i.closed)

    def info(self):
        cdef qpack_linear_info i
        check_status(qpack_linear_get_info(self._h, &i))
        return {"closed": bool(i.closed), "has_original": bool(i.has_original),
                "nbytes_packed": i.nbytes_packed, "nbytes_original": i.nbytes_original}

    def stats(self):
        cdef qpack_linear_stats s
        check_status(qpack_linear_get_stats(self._h, &s))
        return _stats(s)

    def close(self):
        check_status(qpack_linear_close(self._h))


cdef LinearHandle _adopt_linear(qpack_linear* h):
    """A LinearHandle owning h (from a model file)."""
    cdef LinearHandle self = LinearHandle.__new__(LinearHandle)
    self._h = h
    cdef qpack_linear_info info
    check_status(qpack_linear_get_info(h, &info))
    self.in_features = info.in_features
    self.out_features = info.out_features
    self.mode = _MODE_NAMES[info.mode]
    self.has_bias = bool(info.has_bias)
    self.backend = _BACKEND_NAMES[info.backend]
    return self


include "_conv.pxi"
include "_graph.pxi"
include "_model.pxi"
