"""The machine's peak, measured in the same run: bench/peak.c (FMA and VNNI loops, one thread).

Built with the system gcc -O2 and the widest ISA /proc/cpuinfo reports
(AVX-512 F + VNNI, else AVX2 + FMA, with AVX-VNNI when present)."""
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def compile_flags(flags=None):
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512_vnni"} <= flags:
        return ["-mavx512f", "-mavx512vnni", "-mfma"]
    out = ["-mavx2", "-mfma"]
    if "avx_vnni" in flags:
        out.append("-mavxvnni")
    return out


def measure(seconds=0.05, repeats=20):
    """{"isa", "fp32_gflops", "int8_gops"} for one thread (best of `repeats`), or {"error": ...}."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return {"error": "no gcc"}
    with tempfile.TemporaryDirectory(prefix="qpack-peak-") as d:
        exe = os.path.join(d, "peak")
        cmd = [gcc, "-O2", *compile_flags(), os.path.join(HERE, "peak.c"), "-o", exe]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": f"{' '.join(cmd)}: {r.stderr.strip()[:200]}"}
        r = subprocess.run([exe, str(seconds), str(repeats)], capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": f"peak exited {r.returncode}: {r.stderr.strip()[:200]}"}
    out = {"flags": " ".join(compile_flags())}
    for line in r.stdout.splitlines():
        key, _, val = line.partition(" ")
        out[key] = val if key == "isa" else float(val)
    return out
