"""Source models and calibration data for the command line (``qpack freeze``,
``qpack bench``): pure Python over torch, imported only by those commands
(and by ``qpack.load`` of a model frozen from a ``.pt2`` file).

A model is given as one of

- a ``torch.export`` program (``.pt2``, from ``torch.export.save``);
- a TorchScript file (``torch.jit.save``), converted to a ``torch.export``
  program with PyTorch's TorchScript converter on an example input;
- ``package.module:factory``: imported and called with no arguments.

``qpack.freeze`` swaps ``nn.Linear``/``nn.Conv*d`` modules and recognises
PyTorch's modules and functions, while an exported program calls ATen ops on
parameters (``aten.conv2d(x, weight, bias, ...)``). ``from_exported`` rebuilds
the exported graph with the modules and functions those ops stand for, so
that an exported model freezes like the eager model it came from.

Every user error raises ``SourceError`` with a one-line message.
"""
import importlib
import logging
import operator
import os
import sys
import warnings
import zipfile

import torch
from torch import nn


class SourceError(Exception):
    """A model or data file the command line cannot use (the message says why and what to do)."""


def _one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# ---- models ------------------------------------------------------------------------

def load_model(spec, input_shape=None):
    """The eval-mode nn.Module that ``spec`` names (a file or package.module:factory)."""
    if os.path.exists(spec):
        if os.path.isdir(spec):
            raise SourceError(f"{spec} is a directory; MODEL is a .pt2 or TorchScript file, or package.module:factory")
        return _load_file(spec, input_shape)
    if ":" in spec:
        return _load_factory(spec)
    raise SourceError(f"{spec}: no such file; MODEL is a .pt2 file (torch.export.save), a TorchScript file "
                      "(torch.jit.save) or package.module:factory")


def _archive_kind(path):
    """'export', 'torchscript' or None, by the names inside the zip archive torch writes."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return None
    if any(n.endswith("archive_format") or "/models/" in n or n.endswith(".json") and "exported_program" in n
           for n in names):
        return "export"
    if any("/code/" in n or n.endswith("constants.pkl") for n in names):
        return "torchscript"
    return None


def _load_file(path, input_shape):
    kind = _archive_kind(path)
    if kind is None and path.endswith(".pt2"):
        kind = "export"
    if kind == "export":
        try:
            ep = torch.export.load(path)
        except Exception as e:  # noqa: BLE001 - any failure of torch's loader is a bad file to the user
            raise SourceError(f"{path}: torch.export.load failed ({_one_line(e)})") from None
        return from_exported(ep)
    if kind == "torchscript":
        return _load_torchscript(path, input_shape)
    raise SourceError(f"{path}: neither a torch.export program (.pt2) nor a TorchScript file; save the model "
                      "with torch.export.save, or pass package.module:factory")


def _load_torchscript(path, input_shape):
    """TorchScript -> torch.export program -> modules, checked against the TorchScript model.

    qpack.freeze cannot freeze a ScriptModule itself: its layers are
    RecursiveScriptModules, not nn.Linear/nn.Conv2d, and torch.fx cannot trace
    it, so nothing would be packed. PyTorch's TorchScript converter
    (torch._export.converter, experimental) turns it into an exported program
    given an example input, which is why --input-shape is needed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # PyTorch 2.13 deprecates TorchScript itself
            sm = torch.jit.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001
        raise SourceError(f"{path}: torch.jit.load failed ({_one_line(e)})") from None
    if input_shape is None:
        raise SourceError(f"{path} is TorchScript: pass --input-shape so that it can be converted to a "
                          "torch.export program (or pass a .pt2 from torch.export.save, or package.module:factory)")
    try:
        from torch._export.converter import TS2EPConverter
    except ImportError:
        raise SourceError(f"{path} is TorchScript, and this PyTorch has no TorchScript converter; pass a .pt2 "
                          "from torch.export.save, or package.module:factory") from None
    sm.eval()
    x = torch.randn(*input_shape)
    logger = logging.getLogger("torch._export")
    level = logger.level
    try:
        logger.setLevel(logging.ERROR)  # its notes on shapes it specialised to the example input
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # and on constants and unused buffers
            model = from_exported(TS2EPConverter(sm, (x,)).convert())
    except Exception as e:  # noqa: BLE001
        raise SourceError(f"{path}: PyTorch's TorchScript converter failed ({_one_line(e)}); pass a .pt2 from "
                          "torch.export.save, or package.module:factory") from None
    finally:
        logger.setLevel(level)
    with torch.inference_mode():
        want, got = sm(x), model(x)
    if not (torch.is_tensor(want) and torch.is_tensor(got) and want.shape == got.shape
            and torch.allclose(want, got, rtol=1e-4, atol=1e-5)):
        raise SourceError(f"{path}: the TorchScript model converted to a torch.export program computes "
                          "something else on a random input; pass a .pt2 from torch.export.save, or "
                          "package.module:factory")
    return model


def _load_factory(spec):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SourceError(f"{spec}: expected package.module:factory")
    added = os.getcwd() not in sys.path
    if added:
        sys.path.append(os.getcwd())  # like `python -m`: a module beside the user is found
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - the user's module failed to import
        raise SourceError(f"{spec}: cannot import {module_name} ({_one_line(e)})") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SourceError(f"{spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SourceError(f"{spec}: {attr} is not callable (a factory taking no arguments)")
    try:
        model = obj()
    except Exception as e:  # noqa: BLE001 - the user's factory raised
        raise SourceError(f"{spec}: the factory raised {_one_line(e)}") from None
    if not isinstance(model, torch.nn.Module):
        raise SourceError(f"{spec}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


# ---- torch.export programs -> modules ---------------------------------------------

def _arg(node, i, name, default):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _pair(v, n):
    return tuple(v) if isinstance(v, (list, tuple)) else (v,) * n


def _rank(node):
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return val.dim() if hasattr(val, "dim") else None


def _module_for(node, attrs):
    """The nn.Module an ATen call stands for, or None to keep the call as it is."""
    aten = torch.ops.aten
    t = node.target

    def tensor(i, name):
        a = _arg(node, i, name, None)
        if a is None:
            return None
        if not isinstance(a, torch.fx.Node) or a.op != "get_attr":
            raise LookupError  # a computed weight: keep the ATen call
        return attrs[a.target]

    if t in (aten.conv2d.default, aten.conv1d.default, aten.conv2d.padding, aten.conv1d.padding):
        w, b = tensor(1, "weight"), tensor(2, "bias")
        n = 2 if t in (aten.conv2d.default, aten.conv2d.padding) else 1
        stride = _pair(_arg(node, 3, "stride", 1), n)
        padding = _arg(node, 4, "padding", 0)
        padding = padding if isinstance(padding, str) else _pair(padding, n)
        dilation = _pair(_arg(node, 5, "dilation", 1), n)
        groups = _arg(node, 6, "groups", 1)
        cls = nn.Conv2d if n == 2 else nn.Conv1d
        m = cls(w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]), stride=stride, padding=padding,
                dilation=dilation, groups=groups, bias=b is not None, device="meta")
        m.weight = nn.Parameter(w.detach(), requires_grad=False)
        if b is not None:
            m.bias = nn.Parameter(b.detach(), requires_grad=False)
        return m, 1
    if t is aten.linear.default:
        w, b = tensor(1, "weight"), tensor(2, "bias")
        m = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
        m.weight = nn.Parameter(w.detach(), requires_grad=False)
        if b is not None:
            m.bias = nn.Parameter(b.detach(), requires_grad=False)
        return m, 1
    if t is aten.batch_norm.default:
        if _arg(node, 5, "training", False):
            return None
        w, b, mean, var = tensor(1, "weight"), tensor(2, "bias"), tensor(3, "running_mean"), tensor(4, "running_var")
        if mean is None or var is None:
            return None
        rank = _rank(node.args[0])
        cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}.get(rank)
        if cls is None:
            return None
        m = cls(mean.shape[0], eps=float(_arg(node, 7, "eps", 1e-5)), affine=w is not None)
        with torch.no_grad():
            m.running_mean.copy_(mean)
            m.running_var.copy_(var)
            if w is not None:
                m.weight.copy_(w)
                m.bias.copy_(b if b is not None else torch.zeros_like(w))
        return m, 1
    simple = {aten.relu.default: nn.ReLU, aten.relu_.default: nn.ReLU, aten.hardswish.default: nn.Hardswish,
              aten.hardswish_.default: nn.Hardswish, aten.sigmoid.default: nn.Sigmoid, aten.silu.default: nn.SiLU,
              aten.silu_.default: nn.SiLU, aten.hardsigmoid.default: nn.Hardsigmoid}
    if t in simple and len(node.args) == 1:
        return simple[t](), 1
    if t in (aten.hardtanh.default, aten.hardtanh_.default):
        lo, hi = float(_arg(node, 1, "min_val", -1.0)), float(_arg(node, 2, "max_val", 1.0))
        return (nn.ReLU6() if (lo, hi) == (0.0, 6.0) else nn.Hardtanh(lo, hi)), 1
    if t is aten.gelu.default:
        return nn.GELU(approximate=_arg(node, 1, "approximate", "none")), 1
    if t is aten.max_pool2d.default:
        k = _pair(_arg(node, 1, "kernel_size", None), 2)
        s = _arg(node, 2, "stride", ())
        return nn.MaxPool2d(k, stride=_pair(s, 2) if s else k, padding=_pair(_arg(node, 3, "padding", 0), 2),
                            dilation=_pair(_arg(node, 4, "dilation", 1), 2),
                            ceil_mode=bool(_arg(node, 5, "ceil_mode", False))), 1
    if t is aten.avg_pool2d.default:
        k = _pair(_arg(node, 1, "kernel_size", None), 2)
        s = _arg(node, 2, "stride", ())
        return nn.AvgPool2d(k, stride=_pair(s, 2) if s else k, padding=_pair(_arg(node, 3, "padding", 0), 2),
                            ceil_mode=bool(_arg(node, 4, "ceil_mode", False)),
                            count_include_pad=bool(_arg(node, 5, "count_include_pad", True)),
                            divisor_override=_arg(node, 6, "divisor_override", None)), 1
    if t is aten.adaptive_avg_pool2d.default:
        return nn.AdaptiveAvgPool2d(tuple(_arg(node, 1, "output_size", None))), 1
    if t is aten.adaptive_avg_pool1d.default:
        return nn.AdaptiveAvgPool1d(tuple(_arg(node, 1, "output_size", None))), 1
    if t is aten.flatten.using_ints:
        return nn.Flatten(_arg(node, 1, "start_dim", 0), _arg(node, 2, "end_dim", -1)), 1
    if t is aten.dropout.default and not _arg(node, 2, "train", False):
        return nn.Identity(), 1
    return None


def _function_for(node):
    """(function, args, kwargs) of PyTorch's own for an ATen call, or None."""
    aten = torch.ops.aten
    t = node.target
    if t in (aten.add.Tensor, aten.add_.Tensor) and _arg(node, 2, "alpha", 1) == 1 and len(node.args) == 2:
        return operator.add, tuple(node.args), {}
    if t in (aten.mul.Tensor, aten.mul_.Tensor) and len(node.args) == 2:
        return operator.mul, tuple(node.args), {}
    if t is aten.cat.default:
        return torch.cat, (list(node.args[0]), _arg(node, 1, "dim", 0)), {}
    if t is aten.mean.dim and _arg(node, 3, "dtype", None) is None:
        return torch.mean, (node.args[0], list(_arg(node, 1, "dim", None)), bool(_arg(node, 2, "keepdim", False))), {}
    return None


class ExportedModel(nn.Module):
    """A rebuilt exported program as a plain module around ``program`` (an fx GraphModule).

    Not the GraphModule itself: a graph-frozen model keeps its forward in its
    own ``__dict__``, and a GraphModule pickles by its ``__dict__`` in its
    reduce arguments, which then refer to the module itself without end.
    (Not named ``graph``: fx's GraphModule of a trace has its own ``graph``.)"""

    def __init__(self, program):
        super().__init__()
        self.program = program

    def forward(self, x):
        return self.program(x)


def from_exported(ep):
    """An ``ExportedModel`` (eval mode) computing what the exported program ``ep``
    computes: its fx graph rebuilt with nn.Conv*d / nn.Linear / nn.BatchNorm*d /
    activation and pooling modules where the program calls those ATen ops, and
    PyTorch's functions for add, mul, cat and mean. Other ATen calls stay as
    they are (they run in PyTorch). Programs of one tensor input only."""
    from torch.utils import _pytree as pytree
    gm = ep.module()
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise SourceError(f"the exported program takes {len(inputs)} inputs; the command line feeds models one "
                          "tensor (use qpack.freeze from Python for others)")
    attrs = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            obj = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            attrs[node.target] = obj
    graph = torch.fx.Graph()
    env, root, names = {}, {}, set()

    def fresh(base):
        name, k = base, 1
        while name in names or name in attrs:
            name, k = f"{base}_{k}", k + 1
        names.add(name)
        return name

    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target.startswith("_guards"):
            continue  # torch.export's input guards: shapes were fixed when it was exported
        if node.op == "output":
            flat = [env[a] if isinstance(a, torch.fx.Node) else a for a in pytree.tree_leaves(node.args[0])]
            spec = getattr(gm, "_out_spec", None)
            graph.output(pytree.tree_unflatten(flat, spec) if spec is not None else node.args[0])
            continue
        if node.op == "call_function":
            try:
                got = _module_for(node, attrs)
            except LookupError:
                got = None
            if got is not None:
                mod, n_in = got
                name = fresh(node.name)
                root[name] = mod.eval()
                new = graph.call_module(name, tuple(env[a] for a in node.args[:n_in]))
                new.meta = dict(node.meta)
                env[node] = new
                continue
            fn = _function_for(node)
            if fn is not None:
                f, args, kwargs = fn
                new = graph.call_function(f, torch.fx.node.map_arg(args, lambda a: env[a]), kwargs)
                new.meta = dict(node.meta)
                env[node] = new
                continue
        if node.op in ("get_attr", "call_module"):
            root[node.target] = attrs.get(node.target) if node.op == "get_attr" else gm.get_submodule(node.target)
        env[node] = graph.node_copy(node, lambda a: env[a])
    for node in reversed(list(graph.nodes)):
        if node.op == "get_attr" and not node.users:  # weights that now live in modules
            graph.erase_node(node)
    used = {n.target for n in graph.nodes if n.op in ("get_attr", "call_module")}
    return ExportedModel(torch.fx.GraphModule({k: v for k, v in root.items() if k in used}, graph)).eval()


# ---- calibration data --------------------------------------------------------------

def load_batches(path, batch_size):
    """Calibration batches from a .pt file (a tensor split along dim 0, or a list/tuple
    of tensors, one batch each) or a .npy array (split along dim 0)."""
    if batch_size < 1:
        raise SourceError(f"--batch-size must be >= 1, got {batch_size}")
    if path.endswith(".npy"):
        import numpy as np
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise SourceError(f"{path}: not a numpy .npy array ({_one_line(e)})") from None
        data = torch.from_numpy(np.ascontiguousarray(arr))
    else:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch.load's many failure types all mean a bad file
            raise SourceError(f"{path}: torch.load failed ({_one_line(e)}); DATA is a .pt file holding a tensor "
                              "or a list of tensors, or a .npy array") from None
    if torch.is_tensor(data):
        if data.dim() < 1 or data.shape[0] == 0:
            raise SourceError(f"{path}: the tensor has no samples along dim 0 (shape {tuple(data.shape)})")
        batches = list(data.split(batch_size))
    elif isinstance(data, (list, tuple)) and data and all(torch.is_tensor(t) for t in data):
        batches = list(data)
    else:
        raise SourceError(f"{path}: holds {type(data).__name__}; DATA is a tensor (samples along dim 0) or a "
                          "non-empty list of tensors (one batch each)")
    for i, b in enumerate(batches):
        if not b.is_floating_point():
            raise SourceError(f"{path}: batch {i} is {b.dtype}; calibration data must be floating point")
    return [b.to(torch.float32).contiguous() for b in batches]
