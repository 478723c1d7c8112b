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
    """What each backend is and supports, as the core's registry reports it.

    {name: {"available", "compiled", "version", "linear": [modes],
    "conv2d": [modes], "graph_ops": [node kinds], "weight_quantization": [...],
    "int8_input_max": 255 or 127}}, in the order backend="auto" prefers them. int8_input_max is
    the largest uint8 input its static int8 kernels take at full speed on this CPU: 127 for oneDNN
    without VNNI (wider inputs run exact at twice the work unless the op's weights are within
    [-64, 64], which ``freeze``'s default reduce_range="auto" makes them there); 0 when not
    available."""
    out = {}
    for b in _core.backend_infos():
        out[b["name"]] = {
            "available": b["available"],
            "compiled": b["compiled"],
            "version": b["version"],
            "linear": b["linear"],
            "conv2d": b["conv2d"],
            # u8 frozen-graph nodes run on the backend's own operators (graph_report says which)
            "graph_ops": b["graph_ops"],
            "weight_quantization": (["per_tensor_affine", "per_channel_affine"] if b["asymmetric_weights"]
                                    else ["per_tensor_symmetric", "per_channel_symmetric"]),
            "int8_input_max": b["int8_input_max"],
        }
    return out


def build_info():
    """How this qpack was built."""
    return {
        "version": _core.version(),
        # frozen-graph nodes: conv2d/linear run on a backend's kernels, the
        # others on the backend's own operators where it has them
        # (backends()[name]["graph_ops"]), else in the core's own C++
        "graph_nodes": sorted(_core.NODE_KINDS),
        "mobile": _core.build_mobile(),
        "default_retain": _core.get_default_retain(),
        "num_threads": _core.get_num_threads(),
        "forked_child": _core.in_forked_child(),
    }
