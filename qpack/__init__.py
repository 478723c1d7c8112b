"""qpack: prepacked CPU inference weights with explicit lifetimes.

Works with numpy alone; torch tensors are accepted wherever arrays are when
PyTorch is installed.
"""
from qpack._core import (
    BackendError,
    ClosedError,
    Error,
    FileFormatError,
    FileIOError,
    InvalidArgumentError,
    InvalidTypeError,
    OutOfMemoryError,
    UnsupportedError,
    get_num_threads,
    set_num_threads,
)
from qpack._policy import (
    backends,
    build_info,
    get_default_retain,
    retain,
    set_default_retain,
)
from qpack._conv import PackedConv1d, PackedConv2d
from qpack._linear import PackedLinear
from qpack._model import RepackWarning, load, save

__version__ = "0.1.0"

_TORCH_API = {"freeze": "qpack.torch.freeze", "unfreeze": "qpack.torch.freeze",
              "memory_report": "qpack.torch.report", "graph_report": "qpack.torch.graph"}


def __getattr__(name):
    # The torch integration is imported on first use, so `import qpack` needs no torch.
    if name in _TORCH_API:
        import importlib
        return getattr(importlib.import_module(_TORCH_API[name]), name)
    raise AttributeError(f"module 'qpack' has no attribute {name!r}")


__all__ = [
    "BackendError",
    "ClosedError",
    "Error",
    "FileFormatError",
    "FileIOError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "OutOfMemoryError",
    "PackedConv1d",
    "PackedConv2d",
    "PackedLinear",
    "RepackWarning",
    "UnsupportedError",
    "backends",
    "build_info",
    "get_default_retain",
    "get_num_threads",
    "load",
    "retain",
    "save",
    "set_default_retain",
    "set_num_threads",
]
