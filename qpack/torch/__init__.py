"""qpack's PyTorch integration: freeze, unfreeze, memory_report and the frozen modules.

Imported lazily by ``qpack.freeze`` / ``qpack.unfreeze`` / ``qpack.memory_report``
so that ``import qpack`` works without torch.
"""
from qpack.torch.freeze import MAPPING, FreezeContext, FreezeWarning, Rule, fold_bn, freeze, register, unfreeze
from qpack.torch.modules import FrozenConv1d, FrozenConv2d, FrozenLinear
from qpack.torch.report import MemoryReport, memory_report

__all__ = ["MAPPING", "FreezeContext", "FreezeWarning", "FrozenConv1d", "FrozenConv2d", "FrozenLinear",
           "MemoryReport", "Rule", "fold_bn", "freeze", "memory_report", "register", "unfreeze"]
