"""qpack's PyTorch integration: the frozen modules and the freeze machinery.

``qpack.freeze``, ``qpack.unfreeze`` and ``qpack.memory_report`` import this
package on first use, so that ``import qpack`` works without torch. The
submodules keep their own names: ``qpack.torch.freeze`` is the module that
holds the mapping table (``MAPPING``, ``register``), ``qpack.torch.report``
the memory report.
"""
from qpack.torch import freeze, quantize, report  # noqa: F401  (submodules, by name)
from qpack.torch.freeze import MAPPING, FreezeContext, FreezeWarning, Rule, fold_bn, register
from qpack.torch.modules import (FrozenConv1d, FrozenConv2d, FrozenConvTranspose2d, FrozenLinear, FrozenMultiheadAttention,
                                 FrozenTransformerEncoder, FrozenTransformerEncoderLayer, SamePadConv2d)
from qpack.torch.report import MemoryReport

__all__ = ["MAPPING", "FreezeContext", "FreezeWarning", "FrozenConv1d", "FrozenConv2d", "FrozenConvTranspose2d",
           "FrozenLinear",
           "FrozenMultiheadAttention", "FrozenTransformerEncoder", "FrozenTransformerEncoderLayer", "MemoryReport",
           "Rule", "SamePadConv2d", "fold_bn", "register"]
