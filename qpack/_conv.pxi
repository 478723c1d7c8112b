# Conv2dHandle: owns one qpack_conv2d (included by _core.pyx).

LAYOUTS = {"nchw": QPACK_LAYOUT_NCHW, "nhwc": QPACK_LAYOUT_NHWC}


cdef class Conv2dHandle:
    """Owns one qpack_conv2d.

    Activations cross as C-contiguous 4-D arrays in their physical layout:
    "nchw" is [N, C, H, W], "nhwc" is [N, H, W, C]."""
    cdef qpack_conv2d* _h
    cdef readonly int64_t in_channels
    cdef readonly int64_t out_channels
    cdef readonly str mode
    cdef readonly str backend
    cdef readonly bint has_bias
    cdef readonly tuple weight_shape

    def __cinit__(self, args=None, str backend="auto", retain=None, tuple stride=(1, 1),
                  tuple padding=(0, 0, 0, 0), tuple dilation=(1, 1), int groups=1):
        self._h = NULL
        if args is None:  # adopted: see _adopt_conv2d
            return
        cdef qpack_conv2d_params p
        qpack_conv2d_params_init(&p)
        cdef _OpArrays arrays = _OpArrays(args)
        _fill(&p, arrays, args, backend, retain)
        weight = args.weight
        p.out_channels = weight.shape[0]
        p.groups = groups
        p.in_channels = weight.shape[1] * groups
        p.kernel_h = weight.shape[2]
        p.kernel_w = weight.shape[3]
        p.stride_h, p.stride_w = stride
        p.pad_top, p.pad_left, p.pad_bottom, p.pad_right = padding
        p.dilation_h, p.dilation_w = dilation
        cdef qpack_status st
        cdef qpack_conv2d* h = NULL
        with nogil:
            st = qpack_conv2d_create(&p, &h)
        check_status(st)
        self._h = h
        self.in_channels = p.in_channels
        self.out_channels = p.out_channels
        self.mode = args.mode
        self.has_bias = args.bias is not None
        self.weight_shape = tuple(int(d) for d in weight.shape)
        cdef qpack_conv2d_info info
        check_status(qpack_conv2d_get_info(self._h, &info))
        self.backend = _BACKEND_NAMES[info.backend]

    def __dealloc__(self):
        if self._h != NULL:
            qpack_conv2d_destroy(self._h)
            self._h = NULL

    def output_size(self, int64_t height, int64_t width):
        cdef int64_t oh = 0, ow = 0
        check_status(qpack_conv2d_output_size(self._h, height, width, &oh, &ow))
        return oh, ow

    cdef tuple _geometry(self, x, str x_layout, str y_layout):
        if x.ndim != 4 or not x.flags.c_contiguous:
            raise InvalidArgumentError("input must be a C-contiguous 4-D array")
        if x_layout == "nchw":
            n, c, h, w = x.shape
        else:
            n, h, w, c = x.shape
        if c != self.in_channels:
            raise InvalidArgumentError(
                f"input has {c} channels; this convolution takes {self.in_channels}")
        oh, ow = self.output_size(h, w)
        shape = (n, self.out_channels, oh, ow) if y_layout == "nchw" else (n, oh, ow, self.out_channels)
        return n, h, w, shape

    def run_f32(self, x, str x_layout, str y_layout):
        n, h, w, shape = self._geometry(x, x_layout, y_layout)
        out = np.empty(shape, dtype=np.float32)
        cdef const float[::1] xv = x.reshape(-1)
        cdef float[::1] yv = out.reshape(-1)
        cdef const float* xp = &xv[0] if xv.shape[0] > 0 else NULL
        cdef float* yp = &yv[0] if yv.shape[0] > 0 else NULL
        cdef int64_t cn = n, ch = h, cw = w
        cdef qpack_layout xl = LAYOUTS[x_layout], yl = LAYOUTS[y_layout]
        cdef qpack_status st
        with nogil:
            st = qpack_conv2d_run_f32(self._h, cn, ch, cw, xl, xp, yl, yp)
        check_status(st)
        return out

    def run_u8(self, x, float scale, int zero_point, str x_layout, str y_layout):
        n, h, w, shape = self._geometry(x, x_layout, y_layout)
        out = np.empty(shape, dtype=np.uint8)
        cdef const uint8_t[::1] xv = x.reshape(-1)
        cdef uint8_t[::1] yv = out.reshape(-1)
        cdef const uint8_t* xp = &xv[0] if xv.shape[0] > 0 else NULL
        cdef uint8_t* yp = &yv[0] if yv.shape[0] > 0 else NULL
        cdef int64_t cn = n, ch = h, cw = w
        cdef qpack_layout xl = LAYOUTS[x_layout], yl = LAYOUTS[y_layout]
        cdef qpack_status st
        with nogil:
            st = qpack_conv2d_run_u8(self._h, cn, ch, cw, xl, xp, scale, zero_point, yl, yp)
        check_status(st)
        return out

    def release_original(self):
        check_status(qpack_conv2d_release_original(self._h))

    def unpack(self):
        dtype = np.float32 if self.mode == "f32" else np.int8
        w = np.empty(self.weight_shape, dtype=dtype)
        b = np.empty((self.out_channels,), dtype=np.float32)
        cdef uint8_t[::1] wv = w.reshape(-1).view(np.uint8)
        cdef float[::1] bv = b
        cdef qpack_status st
        with nogil:
            st = qpack_conv2d_unpack(self._h, &wv[0], &bv[0])
        check_status(st)
        return w, (b if self.has_bias else None)

    @property
    def closed(self):
        """info()["closed"] without the dict (a frozen layer asks on every call)."""
        cdef qpack_conv2d_info i
        check_status(qpack_conv2d_get_info(self._h, &i))
        return bool(i.closed)

    def info(self):
        cdef qpack_conv2d_info i
        check_status(qpack_conv2d_get_info(self._h, &i))
        return {"closed": bool(i.closed), "has_original": bool(i.has_original),
                "nbytes_packed": i.nbytes_packed, "nbytes_original": i.nbytes_original}

    def stats(self):
        cdef qpack_conv2d_stats s
        check_status(qpack_conv2d_get_stats(self._h, &s))
        return _stats(s)

    def close(self):
        check_status(qpack_conv2d_close(self._h))


cdef Conv2dHandle _adopt_conv2d(qpack_conv2d* h):
    """A Conv2dHandle owning h (from a model file)."""
    cdef Conv2dHandle self = Conv2dHandle.__new__(Conv2dHandle)
    self._h = h
    cdef qpack_conv2d_info info
    check_status(qpack_conv2d_get_info(h, &info))
    self.in_channels = info.in_channels
    self.out_channels = info.out_channels
    self.mode = _MODE_NAMES[info.mode]
    self.has_bias = bool(info.has_bias)
    self.backend = _BACKEND_NAMES[info.backend]
    self.weight_shape = (int(info.out_channels), int(info.in_channels // info.groups),
                         int(info.kernel_h), int(info.kernel_w))
    return self
