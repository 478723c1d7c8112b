"""qpack.save / qpack.load: packed model files (.qpk, docs/FORMAT.md).

The core writes and reads the file (packed weights, graphs, checksums,
mapping); this module puts the Python object around them in the file's host
section: a pickle in which every packed op is a persistent id naming the op
in the file, so loading gives back the same object over packed weights used
in place from the mapped file. No torch import here: torch objects say how
they are saved through ``__qpk_reduce__`` (qpack/torch/modules.py) and
``__qpk_graphs__`` (the core graphs a graph-frozen model runs).
"""
import io
import mmap as _mmap
import os
import pickle
import warnings

import numpy as np

from qpack import _core
from qpack._core import FileFormatError, InvalidArgumentError, InvalidTypeError
from qpack._packed import PackedOp, torch_module

_PID = "qpack.op"
_DATA = "qpack.data"
# Tensor storages at least this large go to DATA sections (mapped on load);
# smaller ones stay in the pickle.
DATA_MIN_BYTES = 4096


class RepackWarning(UserWarning):
    """A loaded op was packed for another layout (another CPU or build) and
    was re-packed from its packed form; save it again on this machine to
    load it in place."""


class _Pickler(pickle.Pickler):
    def __init__(self, f):
        super().__init__(f, protocol=5)
        self.linears, self.convs, self.graphs = [], [], []
        self.data = []     # numpy uint8 views of tensor storages
        self._storages = {}
        self._seen = {}
        torch = torch_module()
        self._typed_storage = None if torch is None else torch.storage.TypedStorage

    def _storage_id(self, s):
        """A large tensor storage as a DATA section (the tensors over it keep
        their offsets, sizes and strides in the pickle)."""
        untyped = s._untyped_storage
        nbytes = untyped.nbytes()
        if nbytes < DATA_MIN_BYTES or untyped.device.type != "cpu":
            return None
        key = (untyped.data_ptr(), nbytes)
        index = self._storages.get(key)
        if index is None:
            torch = torch_module()
            raw = torch.empty(0, dtype=torch.uint8).set_(untyped).numpy()
            self.data.append(raw)
            index = self._storages[key] = len(self.data) - 1
        return (_DATA, index, str(s.dtype).replace("torch.", ""), s._size())

    def persistent_id(self, obj):
        if self._typed_storage is not None and isinstance(obj, self._typed_storage):
            return self._storage_id(obj)
        if not isinstance(obj, PackedOp):
            return None
        h = obj._h
        key = id(h)
        if key not in self._seen:
            if obj.closed:
                raise _core.ClosedError(f"cannot save a closed {obj._what}")
            kinds = self.linears if isinstance(h, _core.LinearHandle) else self.convs
            kinds.append(h)
            self._seen[key] = ("linear" if kinds is self.linears else "conv2d", len(kinds) - 1)
        kind, index = self._seen[key]
        state = {k: v for k, v in obj.__dict__.items() if k != "_h"}
        return (_PID, kind, index, type(obj), state)

    def reducer_override(self, obj):
        reduce = getattr(type(obj), "__qpk_reduce__", None)
        if reduce is None or isinstance(obj, type):
            return NotImplemented
        graphs = getattr(type(obj), "__qpk_graphs__", None)
        if graphs is not None:
            for g in graphs(obj):
                if all(g is not x for x in self.graphs):
                    self.graphs.append(g)
        return reduce(obj)


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, ops, data):
        super().__init__(f)
        self._by_kind = {"linear": [h for h in ops if isinstance(h, _core.LinearHandle)],
                         "conv2d": [h for h in ops if isinstance(h, _core.Conv2dHandle)]}
        self._objs = {}
        self._data = data  # index -> a writable buffer of the DATA section
        self._untyped = {}

    def _storage(self, index, dtype_name, numel):
        torch = torch_module()
        if torch is None:
            raise FileFormatError("the file holds torch tensors; import torch before qpack.load")
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype) or not 0 <= index < len(self._data):
            raise FileFormatError(f"the host section names data {index} ({dtype_name}), which the file does not hold")
        untyped = self._untyped.get(index)
        if untyped is None:
            buf = self._data[index]
            untyped = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage() if len(buf) else \
                torch.UntypedStorage(0)
            self._untyped[index] = untyped
        if numel * dtype.itemsize > untyped.nbytes():
            raise FileFormatError(f"data {index} holds {untyped.nbytes()} bytes, fewer than {numel} {dtype_name}")
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    def persistent_load(self, pid):
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == _DATA:
            return self._storage(*pid[1:])
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == _PID):
            raise FileFormatError(f"unknown persistent id in the host section: {pid!r:.80}")
        _, kind, index, cls, state = pid
        handles = self._by_kind.get(kind)
        if handles is None or not 0 <= index < len(handles):
            raise FileFormatError(f"the host section names {kind} {index}, which the file does not hold")
        key = (kind, index)
        obj = self._objs.get(key)
        if obj is None:  # the same op object wherever it was shared
            obj = cls.__new__(cls)
            obj.__dict__.update(state)
            obj._h = handles[index]
            self._objs[key] = obj
        return obj


def _path(path):
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return os.fspath(path)


def save(obj, path, *, originals=True):
    """Writes ``obj`` to ``path`` as a packed model file (.qpk).

    ``obj``: a frozen model (``qpack.freeze``), a packed layer
    (``PackedLinear``, ``PackedConv1d``/``2d``), or any picklable object
    holding them. Packed weights are written as the kernels read them;
    graphs a frozen model runs are written too (so C code can load them with
    ``qpack_graph_load``); ``originals``: also the original weights of ops
    that still hold them (``retain=True``). The file is written beside
    ``path`` and renamed over it: a process that mapped an older file at
    ``path`` keeps reading it.
    """
    path = _path(path)
    if not isinstance(originals, bool):
        raise InvalidTypeError(f"originals must be True or False, got {originals!r}")
    buf = io.BytesIO()
    p = _Pickler(buf)
    try:
        p.dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise InvalidArgumentError(f"cannot save {type(obj).__name__}: {e}") from None
    if not p.linears and not p.convs:
        raise InvalidArgumentError(f"{type(obj).__name__} holds no packed op; save a frozen model or a packed layer")
    _core.save_model(path, p.linears, p.convs, p.graphs, buf.getvalue(), p.data, originals)


def load(path, *, mmap=True, verify=True, strict=False):
    """The object saved in ``path`` by ``qpack.save``, over its packed weights.

    - ``mmap``: map the file read-only and use the packed weights in place
      (processes loading one file share its pages); False reads it into memory.
    - ``verify``: check every section's XXH3-64 checksum first.
    - ``strict``: raise ``FileFormatError`` when an op was packed for another
      layout (another CPU or build) instead of re-packing it with a
      ``RepackWarning``.

    A corrupt, truncated or foreign file raises ``qpack.FileFormatError``
    naming what failed. The host section is a pickle: load files you trust,
    as with ``torch.load``.
    """
    path = _path(path)
    for name, v in (("mmap", mmap), ("verify", verify), ("strict", strict)):
        if not isinstance(v, bool):
            raise InvalidTypeError(f"{name} must be True or False, got {v!r}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _core.FileIOError(f"could not open {path}: {e.strerror}") from None
    try:
        # The core reads this descriptor, so the tensors mapped below come from
        # the very file it checked, even if another process renames a new one
        # over path meanwhile.
        m = _core.ModelHandle(path, fd, mmap, verify, strict)
        host = m.host()
        if not host:
            raise FileFormatError(f"{path}: no host section (a file written by C); "
                                  "load it with the C API (qpack_model_load)")
        data = _data_buffers(m, fd, mmap)
    finally:
        os.close(fd)
    for line in m.repacked:
        warnings.warn(f"qpack.load: {line}", RepackWarning, stacklevel=2)
    try:
        return _Unpickler(io.BytesIO(host), m.ops(), data).load()
    except FileFormatError:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, KeyError,
            TypeError, ValueError) as e:
        raise FileFormatError(f"{path}: the host section does not unpickle ({type(e).__name__}: {e})") from None


def _data_buffers(m, fd, mmap):
    """Writable buffers over the file's DATA sections: views of one
    copy-on-write mapping (pages shared between processes until written), or,
    when mmap is False, of the core's private copy of the file (no second copy)."""
    n = m.info["num_data"]
    if n == 0:
        return []
    if not mmap:
        return [np.frombuffer(m.data_heap_view(i), dtype=np.uint8) for i in range(n)]
    mm = _mmap.mmap(fd, 0, access=_mmap.ACCESS_COPY)
    whole = np.frombuffer(mm, dtype=np.uint8)
    out = []
    for i in range(n):
        offset, size = m.data_location(i)
        out.append(whole[offset:offset + size])
    return out


__all__ = ["RepackWarning", "load", "save"]
