"""Lifetime policy, thread counts and build information."""
import contextlib

from qpack import _core


def get_default_retain():
    """Process default: True keeps original weights after packing."""
    return _core.get_default_retain()


def set_default_retain(keep):
    """Set the process default (the build's QPACK_MOBILE flag sets the initial one)."""
    if not isinstance(keep, bool):
        raise _core.InvalidTypeError(f"keep must be a bool, got {type(keep).__name__}")
    _core.set_default_retain(keep)


@contextlib.contextmanager
def retain(keep):
    """Thread-local override of the retain default for objects created inside.

    An explicit ``retain=`` on a constructor still wins.
    """
    if not isinstance(keep, bool):
        raise _core.InvalidTypeError(f"keep must be a bool, got {type(keep).__name__}")
    previous = _core.set_thread_retain(keep)
    try:
        yield
    finally:
        _core.set_thread_retain(previous)


def backends():
    """What each backend is, and what it supports."""
    return {
        "onednn": {
            "available": _core.backend_available("onednn"),
            "version": _core.backend_describe("onednn"),
            "linear": ["f32", "int8_static", "int8_dynamic"],
            "weight_quantization": ["per_tensor_symmetric", "per_channel_symmetric"],
        },
        "qnnpack": {
            "available": _core.backend_available("qnnpack"),
            "version": _core.backend_describe("qnnpack"),
            "linear": ["int8_static", "int8_dynamic"],
            "weight_quantization": ["per_tensor_affine", "per_channel_affine"],
        },
    }


def build_info():
    """How this qpack was built."""
    return {
        "mobile": _core.build_mobile(),
        "default_retain": _core.get_default_retain(),
        "num_threads": _core.get_num_threads(),
        "forked_child": _core.in_forked_child(),
    }
