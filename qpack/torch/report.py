"""qpack.memory_report: what each frozen layer holds in memory."""
import dataclasses

from torch import nn

from qpack._core import InvalidTypeError
from qpack.torch.modules import FROZEN_TYPES


@dataclasses.dataclass
class LayerMemory:
    name: str
    op: str
    backend: str
    dtype: str
    nbytes_packed: int
    nbytes_original: int  # original weight bytes still held beside the packed ones (0 when released)


@dataclasses.dataclass
class MemoryReport:
    layers: list
    nbytes_other: int  # parameters and buffers of modules that were not frozen

    @property
    def nbytes_packed(self):
        return sum(r.nbytes_packed for r in self.layers)

    @property
    def nbytes_original(self):
        return sum(r.nbytes_original for r in self.layers)

    @property
    def nbytes_total(self):
        return self.nbytes_packed + self.nbytes_original + self.nbytes_other

    def to_dict(self):
        return {"layers": [dataclasses.asdict(r) for r in self.layers], "nbytes_packed": self.nbytes_packed,
                "nbytes_original": self.nbytes_original, "nbytes_other": self.nbytes_other,
                "nbytes_total": self.nbytes_total}

    def __str__(self):
        rows = [(r.name, r.op, r.backend, r.dtype, _mb(r.nbytes_packed), _mb(r.nbytes_original))
                for r in self.layers]
        rows.append(("total (frozen layers)", "", "", "", _mb(self.nbytes_packed), _mb(self.nbytes_original)))
        rows.append(("other parameters/buffers", "", "", "", "", _mb(self.nbytes_other)))
        head = ("layer", "op", "backend", "dtype", "packed MB", "original MB held")
        widths = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
        line = lambda cells: "  ".join(str(c).ljust(w) if i < 4 else str(c).rjust(w)  # noqa: E731
                                       for i, (c, w) in enumerate(zip(cells, widths)))
        out = [line(head), line(["-" * w for w in widths])]
        out += [line(r) for r in rows]
        return "\n".join(out)

    __repr__ = __str__


def _mb(n):
    return f"{n / 2**20:.3f}"


def memory_report(module):
    """Per frozen layer: name, op, backend, dtype, packed bytes, original bytes still held; and totals."""
    if not isinstance(module, nn.Module):
        raise InvalidTypeError(f"memory_report takes an nn.Module, got {type(module).__name__}")
    layers, frozen_ids = [], set()
    for name, m in module.named_modules():
        if isinstance(m, FROZEN_TYPES):
            frozen_ids.add(id(m))
            orig = m.nbytes_original if m.has_original else 0
            layers.append(LayerMemory(name or "<root>", m._op, m.backend, m.mode, int(m.nbytes_packed), int(orig)))
    other, seen = 0, set()
    for m in module.modules():
        if id(m) in frozen_ids:
            continue
        for t in list(m._parameters.values()) + list(m._buffers.values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                other += t.numel() * t.element_size()
    return MemoryReport(layers, other)
