# cython: language_level=3, boundscheck=False, wraparound=False
"""Cython layer of qpack: Python objects over libqpack's C API.

Knows numpy and the buffer protocol, never torch. The GIL is released for
packing, running and unpacking; errors are translated in _errors.pxi only.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.math cimport INFINITY

import numpy as np

from qpack.includes.libqpack cimport *

include "_errors.pxi"

BACKENDS = {"onednn": QPACK_BACKEND_ONEDNN, "qnnpack": QPACK_BACKEND_QNNPACK}
_BACKEND_NAMES = {QPACK_BACKEND_ONEDNN: "onednn", QPACK_BACKEND_QNNPACK: "qnnpack"}
MODES = {"f32": QPACK_MODE_F32, "int8_static": QPACK_MODE_INT8_STATIC,
         "int8_dynamic": QPACK_MODE_INT8_DYNAMIC}
_MODE_NAMES = {v: k for k, v in MODES.items()}


def get_default_retain():
    return bool(qpack_get_default_retain())


def set_default_retain(keep):
    qpack_set_default_retain(1 if keep else 0)


def set_thread_retain(retain):
    """retain: True, False or None (clear). Returns the previous override."""
    cdef int r = QPACK_RETAIN_DEFAULT if retain is None else (
        QPACK_RETAIN_KEEP if retain else QPACK_RETAIN_RELEASE)
    prev = qpack_set_thread_retain(r)
    return None if prev == QPACK_RETAIN_DEFAULT else bool(prev)


def get_thread_retain():
    cdef int r = qpack_get_thread_retain()
    return None if r == QPACK_RETAIN_DEFAULT else bool(r)


def resolve_retain(retain):
    cdef int r = QPACK_RETAIN_DEFAULT if retain is None else (
        QPACK_RETAIN_KEEP if retain else QPACK_RETAIN_RELEASE)
    return bool(qpack_resolve_retain(r))


def set_num_threads(int n):
    check_status(qpack_set_num_threads(n))


def get_num_threads():
    return qpack_get_num_threads()


def build_mobile():
    return bool(qpack_build_mobile())


def in_forked_child():
    return bool(qpack_in_forked_child())


def backend_describe(name):
    cdef char buf[512]
    cdef qpack_backend b = BACKENDS[name]
    check_status(qpack_backend_describe(b, buf, sizeof(buf)))
    return buf.decode("utf-8", "replace")


def backend_available(name):
    return bool(qpack_backend_available(BACKENDS[name]))


cdef class LinearHandle:
    """Owns one qpack_linear. Arguments are validated numpy arrays (see
    qpack/_linear.py); this class checks only what C needs to stay safe."""
    cdef qpack_linear* _h
    cdef readonly int64_t in_features
    cdef readonly int64_t out_features
    cdef readonly str mode
    cdef readonly str backend
    cdef readonly bint has_bias

    def __cinit__(self, weight, bias, str mode, str backend, retain, weight_scales,
                  weight_zero_points, float clamp_min, float clamp_max,
                  float input_scale, int input_zero_point,
                  float output_scale, int output_zero_point):
        self._h = NULL
        cdef qpack_linear_params p
        qpack_linear_params_init(&p)
        if weight.ndim != 2:
            raise InvalidArgumentError(f"weight must be 2-D [out_features, in_features], got {weight.ndim}-D")
        p.mode = MODES[mode]
        expected = np.float32 if p.mode == QPACK_MODE_F32 else np.int8
        if weight.dtype != expected or not weight.flags.c_contiguous:
            raise InvalidTypeError(f"weight must be a C-contiguous {np.dtype(expected)} array")
        p.out_features = weight.shape[0]
        p.in_features = weight.shape[1]
        p.backend = QPACK_BACKEND_AUTO if backend == "auto" else BACKENDS[backend]
        p.retain = QPACK_RETAIN_DEFAULT if retain is None else (
            QPACK_RETAIN_KEEP if retain else QPACK_RETAIN_RELEASE)
        cdef const uint8_t[::1] wbytes = weight.reshape(-1).view(np.uint8)
        if wbytes.shape[0] > 0:
            p.weight = &wbytes[0]
        cdef const float[::1] bview
        if bias is not None:
            if bias.dtype != np.float32 or bias.ndim != 1 or bias.shape[0] != p.out_features:
                raise InvalidArgumentError(
                    f"bias must be float32 of shape [{p.out_features}], got {bias.dtype} {tuple(bias.shape)}")
            bview = np.ascontiguousarray(bias)
            p.bias = &bview[0]
        cdef const float[::1] sview
        cdef const int32_t[::1] zview
        if weight_scales is not None:
            sview = np.ascontiguousarray(weight_scales, dtype=np.float32)
            p.num_weight_scales = sview.shape[0]
            if sview.shape[0] > 0:
                p.weight_scales = &sview[0]
            if weight_zero_points is not None:
                zview = np.ascontiguousarray(weight_zero_points, dtype=np.int32)
                if zview.shape[0] != sview.shape[0]:
                    raise InvalidArgumentError(
                        f"weight zero points ({zview.shape[0]}) and scales ({sview.shape[0]}) differ in length")
                if zview.shape[0] > 0:
                    p.weight_zero_points = &zview[0]
        p.clamp_min = clamp_min
        p.clamp_max = clamp_max
        p.input_scale = input_scale
        p.input_zero_point = input_zero_point
        p.output_scale = output_scale
        p.output_zero_point = output_zero_point
        cdef qpack_status st
        cdef qpack_linear* h = NULL
        with nogil:
            st = qpack_linear_create(&p, &h)
        check_status(st)
        self._h = h
        self.in_features = p.in_features
        self.out_features = p.out_features
        self.mode = mode
        self.has_bias = bias is not None
        cdef qpack_linear_info info
        check_status(qpack_linear_get_info(self._h, &info))
        self.backend = _BACKEND_NAMES[info.backend]

    def __dealloc__(self):
        if self._h != NULL:
            qpack_linear_destroy(self._h)
            self._h = NULL

    def run_f32(self, x):
        """x: C-contiguous float32 [M, K] -> float32 [M, N]."""
        cdef const float[:, ::1] xv = x
        cdef int64_t m = xv.shape[0]
        if xv.shape[1] != self.in_features:
            raise InvalidArgumentError(
                f"input has {xv.shape[1]} features; this layer takes {self.in_features}")
        out = np.empty((m, self.out_features), dtype=np.float32)
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
        cdef const uint8_t[:, ::1] xv = x
        cdef int64_t m = xv.shape[0]
        if xv.shape[1] != self.in_features:
            raise InvalidArgumentError(
                f"input has {xv.shape[1]} features; this layer takes {self.in_features}")
        out = np.empty((m, self.out_features), dtype=np.uint8)
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

    def info(self):
        cdef qpack_linear_info i
        check_status(qpack_linear_get_info(self._h, &i))
        return {"has_original": bool(i.has_original), "nbytes_packed": i.nbytes_packed,
                "nbytes_original": i.nbytes_original}

    def stats(self):
        cdef qpack_linear_stats s
        check_status(qpack_linear_get_stats(self._h, &s))
        return {"states_built": s.states_built, "cache_hits": s.cache_hits,
                "evictions": s.evictions, "runs": s.runs}

    def close(self):
        check_status(qpack_linear_close(self._h))

    @property
    def closed(self):
        cdef qpack_linear_info i
        return qpack_linear_get_info(self._h, &i) == QPACK_STATUS_CLOSED
include "_conv.pxi"
