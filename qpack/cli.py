"""The ``qpack`` command line: freeze a model into a ``.qpk`` file, inspect and
verify such files, and time them.

    qpack freeze MODEL -o model.qpk [--int8 [--calibrate DATA]] ...
    qpack inspect model.qpk [--json] [--no-verify]
    qpack verify model.qpk
    qpack bench model.qpk --input-shape 1,3,224,224 [--source MODEL]

``inspect`` reads files with qpack/_file.py alone (no torch, no core), so it
works on files the core refuses. User errors end in one line on stderr and
exit code 1 (2 for bad arguments, as click does); never a traceback.
"""
import json
import math
import os
import statistics
import sys
import time
import warnings

import click

from qpack import _file


class _Failed(click.ClickException):
    """A one-line error, exit code 1."""

    def show(self, file=None):
        click.echo(f"qpack: error: {self.format_message()}", err=True)


def _sources():
    from qpack import _sources as s  # torch, imported by the commands that need it
    return s


def _shape(ctx, param, value):
    """--input-shape '1,3,224,224' (or '1x3x224x224') -> (1, 3, 224, 224)."""
    if value is None:
        return None
    try:
        dims = tuple(int(p) for p in value.replace("x", ",").split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected integers separated by commas, e.g. 1,3,224,224") from None
    if any(d < 1 for d in dims):
        raise click.BadParameter(f"{value!r}: every dimension must be >= 1")
    return dims


def _load_source(model, input_shape):
    s = _sources()
    try:
        return s.load_model(model, input_shape)
    except s.SourceError as e:
        raise _Failed(str(e)) from None


def _first_line(x):
    lines = str(x).strip().splitlines()
    return lines[0] if lines else ""


def _one_line(e):
    return f"{type(e).__name__}: {_first_line(e)}"[:300]


def _echo_warnings(caught):
    for w in caught:
        if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
            continue
        click.echo(f"qpack: warning: {_first_line(w.message)}", err=True)


# ---- formatting ------------------------------------------------------------------------

def _nbytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _table(headers, rows, indent="  "):
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def _geometry(op):
    g = op.get("geometry") or {}
    if op.get("op") == "linear" and "K" in g:
        return f"{g['K']} -> {g['N']}"
    if op.get("op") == "conv2d" and "IC" in g:
        pads = (g["pad_top"], g["pad_left"], g["pad_bottom"], g["pad_right"])
        pad = str(pads[0]) if len(set(pads)) == 1 else ",".join(map(str, pads))
        text = f"{g['IC']} -> {g['OC']} k{g['KH']}x{g['KW']} s{g['stride_h']}x{g['stride_w']} p{pad}"
        if (g["dilation_h"], g["dilation_w"]) != (1, 1):
            text += f" d{g['dilation_h']}x{g['dilation_w']}"
        if g["groups"] != 1:
            text += f" g{g['groups']}"
        return text
    return " ".join(f"{k}={v}" for k, v in g.items()) or "?"


def _layout(op):
    lay = op.get("layout") or {}
    if lay.get("tag") == "onednn" and "summary" in lay:
        return f"{lay['summary']} {lay['data_type']}" + (" split" if lay.get("split") else "")
    if lay.get("tag") == "qnnpack" and "summary" in lay:
        s = lay["bias_input_scale"]
        return lay["summary"] + (f" bias@{s:.4g}" if s else "")
    return lay.get("tag", "?")


def _value(v):
    if v is None:
        return "?"
    if v["dtype"] == "u8":
        return f"u8 s={v['scale']:.4g} zp={v['zero_point']}"
    return v["dtype"]


def _activation(n):
    a = n["activation"]
    if a == "none":
        return ""
    if a == "clamp":
        return f"clamp[{n['act_min']:g}, {n['act_max']:g}]"
    return a


def _state(s):
    return {True: "ok", False: "BAD", None: "not verified"}[s["ok"]]


def _report(d):
    """The text of ``qpack inspect``."""
    out = []
    h = d["header"]
    out.append(f"{d['path']}: {d['file_bytes']} bytes ({_nbytes(d['file_bytes'])})")
    if "format_version" in h:
        out.append(f"  format {h['format_version']}, written by qpack {h['qpack_version'] or '?'}")
        out.append(f"  onednn:  {h['onednn_build'] or '(none)'}" + (f"  isa {h['onednn_isa']}" if h["onednn_isa"] else ""))
        out.append(f"  qnnpack: {h['qnnpack_build'] or '(none)'}" + (f"  isa {h['qnnpack_isa']}" if h["qnnpack_isa"] else ""))
        table_ok = h.get("table_checksum_ok")
        out.append(f"  header checksum {'ok' if h['header_checksum_ok'] else 'BAD'}, table checksum "
                   f"{'ok' if table_ok else 'BAD' if table_ok is False else 'not read'}")
    if d["sections"]:
        out.append("")
        out.append(f"sections ({len(d['sections'])})")
        out.append(_table(["#", "type", "offset", "size", "checksum", "state"],
                          [[s["index"], s["type"], s["offset"], s["size"], f"{s['checksum']:016x}", _state(s)]
                           for s in d["sections"]]))
    if d["ops"]:
        out.append("")
        out.append(f"ops ({len(d['ops'])})")
        rows = []
        for op in d["ops"]:
            scales = op["num_weight_scales"]
            rows.append([op["index"], op["op"] or "?", op["backend"] or "?", op["mode"] or "?", _geometry(op),
                         "per-channel" if scales > 1 else "per-tensor" if scales == 1 else "-",
                         "yes" if op["has_bias"] else "no", _nbytes(op["packed_bytes"]),
                         _nbytes(op["original_bytes"]) if op["original_bytes"] else "released", _layout(op)])
        out.append(_table(["#", "op", "backend", "mode", "geometry", "scales", "bias", "packed", "original",
                           "layout"], rows))
    for g in d["graphs"]:
        out.append("")
        out.append(f"graph {g['index']}: {len(g['values'])} values, inputs {g['inputs']}, outputs {g['outputs']}, "
                   f"{len(g['nodes'])} nodes")
        values = g["values"]
        rows = []
        for n in g["nodes"]:
            v = values[n["output"]] if 0 <= n["output"] < len(values) else None
            rows.append([n["index"], n["kind"], f"{','.join(map(str, n['inputs']))} -> {n['output']}", _value(v),
                         n["op"] if n["op"] >= 0 else "-", _activation(n)])
        out.append(_table(["#", "kind", "inputs -> output", "dtype/qparams", "op", "activation"], rows))
    out.append("")
    packed = sum(op["packed_bytes"] for op in d["ops"])
    original = sum(op["original_bytes"] for op in d["ops"])
    out.append(f"total: {len(d['ops'])} ops, {len(d['graphs'])} graphs; packed {_nbytes(packed)}, original "
               f"{_nbytes(original)}, host {_nbytes(d['host_bytes'])}, data {_nbytes(d['data_bytes'])}, "
               f"file {_nbytes(d['file_bytes'])}")
    if d["problems"]:
        out.append(f"problems ({len(d['problems'])}):")
        out.extend(f"  - {p}" for p in d["problems"])
    elif d["verified"]:
        out.append("no problems (checksums verified)")
    else:
        out.append("no problems (section checksums not verified)")
    return "\n".join(out)


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # 'inf', '-inf', 'nan': JSON has no such numbers
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _describe(path, verify):
    try:
        return _file.describe(path, verify=verify)
    except OSError as e:
        raise _Failed(f"{path}: {e.strerror or e}") from None


# ---- commands --------------------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qpack", prog_name="qpack")
def main():
    """Freeze PyTorch models onto prepacked weights (.qpk files), inspect, verify and time them."""


_FILE = click.Path(exists=True, dir_okay=False)


def _random_input(shape):
    import torch
    return torch.randn(*shape)


def _compare(src, frozen, x):
    """(max |frozen(x) - src(x)|, max |src(x)|), or None when the outputs are not one tensor each."""
    import torch
    try:
        with torch.inference_mode():
            want, got = src(x), frozen(x)
    except Exception as e:  # noqa: BLE001 - a wrong --input-shape and the like
        raise _Failed(f"the model does not run on an input of shape {tuple(x.shape)}: {_one_line(e)}") from None
    if not (torch.is_tensor(want) and torch.is_tensor(got) and want.shape == got.shape):
        return None
    return float((got.float() - want.float()).abs().max()), float(want.float().abs().max())


@main.command()
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The .qpk file to write.")
@click.option("--int8", "int8", is_flag=True,
              help="Quantize to int8: static (uint8 activations) with --calibrate, else dynamic (linear layers only).")
@click.option("--calibrate", "data", type=_FILE,
              help="Calibration data for --int8: a .pt file (a tensor, samples along dim 0, or a list of "
                   "tensors, one batch each) or a .npy array.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1),
              help="Calibration batch size when DATA is one tensor or array.")
@click.option("--input-shape", callback=_shape,
              help="Input shape, e.g. 1,3,224,224: converts TorchScript models and checks the frozen model "
                   "against the source on a random input.")
@click.option("--backend", type=click.Choice(["auto", "onednn", "qnnpack"]), default="auto", show_default=True,
              help="Backend of the int8 layers (fp32 layers run on oneDNN).")
@click.option("--retain/--no-retain", default=None,
              help="Keep the original weights beside the packed ones (saved too), or release them. "
                   "Default: the process default of this build.")
@click.option("--no-graph", is_flag=True, help="Run layer by layer instead of as core graphs.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars and no summary.")
def freeze(model, output, int8, data, batch_size, input_shape, backend, retain, no_graph, quiet):
    """Freeze MODEL onto packed weights and save it as a .qpk file.

    MODEL is a torch.export program (.pt2, from torch.export.save), a TorchScript
    file (needs --input-shape), or package.module:factory (a function called
    with no arguments that returns an nn.Module).
    """
    if data is not None and not int8:
        raise click.UsageError("--calibrate calibrates int8 layers: add --int8")
    import qpack
    src = _load_source(model, input_shape)
    s = _sources()
    batches = None
    if data is not None:
        try:
            batches = s.load_batches(data, batch_size)
        except s.SourceError as e:
            raise _Failed(str(e)) from None
    progress = not quiet and sys.stderr.isatty()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            frozen = qpack.freeze(src, dtype="int8" if int8 else None, example_inputs=batches, backend=backend,
                                  retain=retain, graph=not no_graph, progress=progress)
        except qpack.Error as e:
            raise _Failed(f"qpack.freeze: {e}") from None
        except Exception as e:  # noqa: BLE001 - the user's model failed to run on the calibration data
            raise _Failed(f"qpack.freeze failed on {model}: {_one_line(e)}") from None
    _echo_warnings(caught)
    x = _random_input(input_shape) if input_shape else (batches[0] if batches else None)
    check = None if x is None else _compare(src, frozen, x)
    if not qpack.memory_report(frozen).layers:
        raise _Failed(f"no layer of {model} was frozen (qpack packs nn.Linear, nn.Conv1d and nn.Conv2d layers "
                      "with float32 or int8 weights), so there is nothing to save")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            qpack.save(frozen, output)
    except Exception as e:  # noqa: BLE001 - e.g. a model attribute pickle cannot save
        raise _Failed(f"could not save {output}: {_one_line(e)}") from None
    _echo_warnings(caught)
    d = _describe(output, verify=False)
    if quiet:
        return
    modes = sorted({op["mode"] for op in d["ops"] if op["mode"]})
    packed = sum(op["packed_bytes"] for op in d["ops"])
    original = sum(op["original_bytes"] for op in d["ops"])
    click.echo(f"{output}: {len(d['ops'])} ops ({', '.join(modes) or 'none'}), {len(d['graphs'])} graphs, "
               f"packed {_nbytes(packed)}, original {_nbytes(original) if original else 'released'}, "
               f"file {_nbytes(d['file_bytes'])}")
    if check is not None:
        click.echo(f"check: max |frozen - source| = {check[0]:.3g} (max |source| = {check[1]:.3g}) on an input of "
                   f"shape {tuple(x.shape)}")


@main.command()
@click.argument("file", type=_FILE)
@click.option("--verify/--no-verify", default=True, show_default=True, help="Checksum every section.")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def inspect(file, verify, as_json):
    """Show what a .qpk FILE holds: header, sections, ops, graphs; and every problem found.

    Reads the file without loading it (works on files the core refuses); exit
    code 1 when a check fails.
    """
    d = _describe(file, verify)
    if as_json:
        click.echo(json.dumps(_jsonable(d), indent=2))
    else:
        click.echo(_report(d))
    if d["problems"]:
        sys.exit(1)


@main.command()
@click.argument("file", type=_FILE)
def verify(file):
    """Check FILE: checksums and structure, then that qpack loads it. Exit code 0 when sound."""
    d = _describe(file, verify=True)
    if d["problems"]:
        for p in d["problems"]:
            click.echo(f"{file}: {p}")
        click.echo(f"{file}: FAILED ({len(d['problems'])} problems)")
        sys.exit(1)
    import qpack
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            obj = qpack.load(file, strict=False)
        except Exception as e:  # noqa: BLE001 - qpack.Error, OSError, or the host pickle's own failures
            click.echo(f"{file}: qpack.load: {_one_line(e)}")
            click.echo(f"{file}: FAILED (qpack.load refuses it)")
            sys.exit(1)
    for w in caught:
        if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
            click.echo(f"{file}: note: {_first_line(w.message)}")
    del obj
    click.echo(f"{file}: OK ({len(d['ops'])} ops, {len(d['graphs'])} graphs, {len(d['sections'])} sections, "
               "checksums verified, loads)")


def _percentile(sorted_ms, q):
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)]


def _time(fn, x, runs, warmup):
    import torch
    with torch.inference_mode():
        for _ in range(warmup):
            out = fn(x)
        ms = []
        for _ in range(runs):
            t0 = time.perf_counter()
            out = fn(x)
            ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return statistics.median(ms), _percentile(ms, 0.9), out


@main.command()
@click.argument("file", type=_FILE)
@click.option("--input-shape", callback=_shape, required=True, help="Input shape, e.g. 1,3,224,224.")
@click.option("--threads", type=click.IntRange(min=1), help="Threads for qpack and PyTorch (default: theirs).")
@click.option("--runs", default=50, show_default=True, type=click.IntRange(min=1), help="Timed runs.")
@click.option("--source", help="The source model (as for freeze), timed side by side.")
def bench(file, input_shape, threads, runs, source):
    """Time the model in FILE on a random input: median and p90 latency (ms)."""
    import qpack
    import torch
    if threads is not None:
        qpack.set_num_threads(threads)
        torch.set_num_threads(threads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = qpack.load(file)
        except Exception as e:  # noqa: BLE001 - qpack.Error, OSError, or the host pickle's own failures
            raise _Failed(f"{file}: {_one_line(e)}") from None
    _echo_warnings(caught)
    if not callable(model):
        raise _Failed(f"{file} holds a {type(model).__name__}, not a model to run")
    src = _load_source(source, input_shape) if source else None
    x = _random_input(input_shape)
    warmup = max(3, runs // 10)
    rows = []
    try:
        med, p90, out = _time(model, x, runs, warmup)
    except Exception as e:  # noqa: BLE001 - wrong input shape and the like
        raise _Failed(f"{file} does not run on an input of shape {input_shape}: {_one_line(e)}") from None
    rows.append(["qpack", os.path.basename(file), f"{med:.4g}", f"{p90:.4g}"])
    ratio = diff = None
    if src is not None:
        try:
            s_med, s_p90, s_out = _time(src, x, runs, warmup)
        except Exception as e:  # noqa: BLE001
            raise _Failed(f"{source} does not run on an input of shape {input_shape}: {_one_line(e)}") from None
        rows.append(["source", source, f"{s_med:.4g}", f"{s_p90:.4g}"])
        ratio = s_med / med if med > 0 else float("inf")
        if torch.is_tensor(out) and torch.is_tensor(s_out) and out.shape == s_out.shape:
            diff = float((out.float() - s_out.float()).abs().max())
    click.echo(f"input {tuple(input_shape)}, {runs} runs after {warmup} warm-up, threads: qpack "
               f"{qpack.get_num_threads()}, torch {torch.get_num_threads()}")
    click.echo(_table(["model", "file", "median ms", "p90 ms"], rows, indent=""))
    if ratio is not None:
        click.echo(f"source / qpack median: {ratio:.3g}x" + (f"; max |qpack - source| = {diff:.3g}" if diff is not None else ""))


if __name__ == "__main__":  # pragma: no cover
    main()
