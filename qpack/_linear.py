"""PackedLinear: a linear layer whose weights live in a backend's packed layout."""
import numpy as np

from qpack import _core
from qpack._core import InvalidArgumentError
from qpack._packed import OpArgs, PackedOp, input_array, is_torch, torch_module


class PackedLinear(PackedOp):
    """y = x @ weight.T + bias, on weights packed once for oneDNN or QNNPACK.

    Quantized data is plain integers plus explicit parameters:

    - float32 weight: an fp32 layer (oneDNN).
    - int8 weight + ``weight_scale`` (a float, or one per output feature;
      symmetric): with ``output_scale``/``output_zero_point`` a static layer
      (uint8 in, uint8 out); with ``dynamic=True`` a dynamic one (float in and
      out, the input quantized per call as PyTorch does).
    - a legacy ``torch.qint8`` weight carries its own scales.

    ``retain`` keeps (True) or releases (False) the original weight once
    packed; None defers to ``qpack.retain(...)`` then the process default.
    ``unpack()`` works either way: after release it reconstructs the weight
    bit-exactly from the packed form.
    """

    _what = "packed linear"
    _noun = "layer"

    def __init__(self, weight, bias=None, *, backend="auto", retain=None, activation=None,
                 weight_scale=None, input_scale=None, input_zero_point=None,
                 output_scale=None, output_zero_point=None, dynamic=False):
        def check_shape(w):
            if w.ndim != 2:
                raise InvalidArgumentError(
                    f"weight must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
            return w

        args = OpArgs("layer", weight, bias, retain=retain, activation=activation,
                      weight_scale=weight_scale, input_scale=input_scale,
                      input_zero_point=input_zero_point, output_scale=output_scale,
                      output_zero_point=output_zero_point, dynamic=dynamic, check_shape=check_shape)
        self._init_from(args, _core.LinearHandle(args, backend, retain))
        self._activation = activation
        self.in_features = int(args.weight.shape[1])
        self.out_features = int(args.weight.shape[0])

    # ---- running ---------------------------------------------------------

    def __call__(self, x, scale=None, zero_point=None):
        return self.forward(x, scale=scale, zero_point=zero_point)

    def forward(self, x, scale=None, zero_point=None):
        xa, scale, zero_point, legacy = input_array(x, scale, zero_point)
        torch_in = legacy or is_torch(x)
        if xa.ndim < 1:
            raise InvalidArgumentError("input must have at least one dimension [..., in_features]")
        if not xa.flags.c_contiguous:
            raise InvalidArgumentError("input must be contiguous; call .contiguous() (torch) or "
                                       "np.ascontiguousarray (numpy) first")
        kind, scale, zero_point = self._run_args(xa, scale, zero_point)
        x2 = xa.reshape(int(np.prod(xa.shape[:-1])), xa.shape[-1])
        if kind == "u8":
            y = self._h.run_u8(x2, scale, zero_point)
        else:
            y = self._h.run_f32(x2)
        y = y.reshape(xa.shape[:-1] + (self.out_features,))
        if not torch_in:
            return y
        torch = torch_module()
        yt = torch.from_numpy(y)
        if legacy:
            return torch._make_per_tensor_quantized_tensor(yt, self.output_scale, self.output_zero_point)
        return yt

    # ---- lifetime ----------------------------------------------------------

    def unpack(self):
        """(weight, bias) as given: reconstructed from the packed form if released."""
        return self._unpack_as_given()

    @property
    def weight_zero_point(self):
        if self._weight_zero_points is None:
            return None if self._weight_scale is None else np.zeros_like(self._weight_scale, dtype=np.int32)
        return self._weight_zero_points.copy()

    def __repr__(self):
        return (f"PackedLinear(in_features={self.in_features}, out_features={self.out_features}, "
                f"mode={self.mode}, backend={self.backend}, {self._state()})")
