"""PackedConv2d and PackedConv1d: convolutions whose weights live in a backend's packed layout."""
import numpy as np

from qpack import _core
from qpack._core import InvalidArgumentError, InvalidTypeError
from qpack._packed import OpArgs, PackedOp, input_array, is_torch, torch_module


def _int_tuple(value, n, name):
    """int or sequence of n ints -> tuple of n ints (the core checks their range)."""
    items = (value,) * n if isinstance(value, (int, np.integer)) else value
    try:
        items = tuple(items)
    except TypeError:
        raise InvalidTypeError(f"{name} must be an int or a tuple of {n} ints, got {value!r}") from None
    if len(items) != n or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items):
        raise InvalidTypeError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
    return tuple(int(v) for v in items)


def _padding(padding, kernel, stride, dilation):
    """padding (int, pair, 'same', 'valid') -> (top, left, bottom, right), like torch."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding != "same":
            raise InvalidArgumentError(f"padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
        if stride != (1, 1):
            raise InvalidArgumentError("padding='same' is not supported for strided convolutions (as in torch)")
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2
    ph, pw = _int_tuple(padding, 2, "padding")
    return ph, pw, ph, pw


class PackedConv2d(PackedOp):
    """torch.nn.functional.conv2d on weights packed once for oneDNN or QNNPACK.

    ``weight`` is [out_channels, in_channels/groups, kh, kw]:

    - float32: an fp32 convolution (oneDNN). Input NCHW or channels_last;
      the output has the input's memory format.
    - int8 + ``weight_scale`` (a float, or one per output channel) +
      ``output_scale``/``output_zero_point``: a static int8 convolution, uint8
      in (scale and zero point per call, or ``input_scale``/``input_zero_point``
      here) and uint8 out. QNNPACK returns channels_last, like PyTorch's
      quantized conv; oneDNN keeps the input's memory format.
    - a legacy ``torch.qint8`` weight carries its own scales; ``torch.quint8``
      inputs give ``torch.quint8`` outputs.

    ``activation``: None, 'relu', 'relu6' or ('hardtanh', min, max), fused.
    ``retain`` keeps (True) or releases (False) the original weight once
    packed; ``unpack()`` reconstructs it bit-exactly from the packed form either way.
    """

    _spatial = 2
    _what = "packed convolution"
    _noun = "convolution"

    def __init__(self, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
                 backend="auto", retain=None, activation=None, weight_scale=None,
                 input_scale=None, input_zero_point=None, output_scale=None,
                 output_zero_point=None):
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
            raise InvalidTypeError(f"groups must be an int, got {groups!r}")
        nd = self._spatial + 2

        def check_shape(w):
            if w.ndim != nd:
                raise InvalidArgumentError(
                    f"weight must be {nd}-D [out_channels, in_channels/groups, "
                    f"{'kh, kw' if nd == 4 else 'k'}], got shape {tuple(w.shape)}")
            if 0 in w.shape:
                raise InvalidArgumentError(f"weight must not be empty, got shape {tuple(w.shape)}")
            return w if nd == 4 else w[:, :, None, :]

        args = OpArgs("convolution", weight, bias, retain=retain, activation=activation,
                      weight_scale=weight_scale, input_scale=input_scale,
                      input_zero_point=input_zero_point, output_scale=output_scale,
                      output_zero_point=output_zero_point, dynamic=False, check_shape=check_shape)
        w4 = args.weight
        stride2, dilation2, padding4 = self._geometry(stride, padding, dilation, w4.shape[2:])
        self._init_from(args, _core.Conv2dHandle(args, backend, retain, stride2, padding4, dilation2,
                                                 int(groups)))
        self._activation = activation
        self.weight_shape = tuple(int(d) for d in (w4.shape if nd == 4 else w4[:, :, 0, :].shape))
        self.groups = int(groups)
        self.in_channels = int(w4.shape[1]) * self.groups
        self.out_channels = int(w4.shape[0])

    def _geometry(self, stride, padding, dilation, kernel):
        stride2 = _int_tuple(stride, 2, "stride")
        dilation2 = _int_tuple(dilation, 2, "dilation")
        return stride2, dilation2, _padding(padding, tuple(kernel), stride2, dilation2)

    # ---- running ---------------------------------------------------------

    def __call__(self, x, scale=None, zero_point=None):
        return self.forward(x, scale=scale, zero_point=zero_point)

    def _layout(self, x, xa):
        """(physical C-contiguous array, 'nchw' | 'nhwc') of a 4-D input."""
        if is_torch(x) and not x.is_contiguous() and x.is_contiguous(
                memory_format=torch_module().channels_last):
            return np.ascontiguousarray(xa.transpose(0, 2, 3, 1)), "nhwc"
        if xa.flags.c_contiguous:
            return xa, "nchw"
        nhwc = xa.transpose(0, 2, 3, 1)
        if nhwc.flags.c_contiguous:
            return nhwc, "nhwc"
        return np.ascontiguousarray(xa), "nchw"

    def _output_layout(self, x_layout):
        return "nhwc" if self.backend == "qnnpack" else x_layout

    def forward(self, x, scale=None, zero_point=None):
        h = self._h
        xa, scale, zero_point, legacy = input_array(x, scale, zero_point)
        torch_in = legacy or is_torch(x)
        nd = self._spatial + 2
        if xa.ndim not in (nd - 1, nd):
            raise InvalidArgumentError(
                f"input must be {nd}-D [batch, channels, ...] (or {nd - 1}-D unbatched), got shape {tuple(xa.shape)}")
        unbatched = xa.ndim == nd - 1
        if unbatched:
            xa = xa[None]
        if self._spatial == 1:
            x4 = xa[:, :, None, :]
        else:
            x4 = xa
        if x4.shape[1] != self.in_channels:
            raise InvalidArgumentError(
                f"input has {x4.shape[1]} channels (dim 1); this convolution takes {self.in_channels}")
        phys, x_layout = self._layout(x if (torch_in and not legacy and self._spatial == 2
                                            and not unbatched) else None, x4)
        y_layout = self._output_layout(x_layout)
        kind, scale, zero_point = self._run_args(phys, scale, zero_point)
        if kind == "u8":
            y = h.run_u8(phys, scale, zero_point, x_layout, y_layout)
        else:
            y = h.run_f32(phys, x_layout, y_layout)
        return self._wrap(y, y_layout, unbatched, torch_in, legacy)

    def _wrap(self, y, y_layout, unbatched, torch_in, legacy):
        """Physical output -> logical [N, C, ...] array or tensor (memory format kept)."""
        perm = (0, 3, 1, 2) if y_layout == "nhwc" else None
        if torch_in:
            torch = torch_module()
            y = torch.from_numpy(y)
            if legacy:
                y = torch._make_per_tensor_quantized_tensor(y, self.output_scale, self.output_zero_point)
            if perm is not None:
                y = y.permute(*perm)
        elif perm is not None:
            y = y.transpose(*perm)
        if self._spatial == 1:
            y = y[:, :, 0, :]
        return y[0] if unbatched else y

    # ---- lifetime ----------------------------------------------------------

    def unpack(self):
        """(weight, bias) as given: reconstructed from the packed form if released."""
        w, b = self._unpack_as_given()
        return w.reshape(self.weight_shape), b

    def __repr__(self):
        state = self._state()
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"kernel={self.weight_shape[2:]}, groups={self.groups}, mode={self.mode}, "
                f"backend={self.backend}, {state})")


class PackedConv1d(PackedConv2d):
    """torch.nn.functional.conv1d on packed weights (the 2-D op with height 1).

    ``weight`` is [out_channels, in_channels/groups, k]; input [N, C, L] (or
    [C, L]); stride, padding and dilation are ints (or 1-tuples), padding also
    'same' or 'valid'. Everything else as :class:`PackedConv2d`; the output is
    a contiguous [N, out_channels, L_out] on both backends.
    """

    _spatial = 1

    def _geometry(self, stride, padding, dilation, kernel):
        (s,) = _int_tuple(stride, 1, "stride")
        (d,) = _int_tuple(dilation, 1, "dilation")
        if not isinstance(padding, str):
            (p,) = _int_tuple(padding, 1, "padding")
            padding = (0, p)
        return (1, s), (1, d), _padding(padding, tuple(kernel), (1, s), (1, d))

    def _output_layout(self, x_layout):
        return "nchw"
