#!/usr/bin/env bash
# Build qpack the way conda does, without conda: conda/build.sh in a host prefix
# laid out like a conda environment, with oneDNN present as plain files
# ($PREFIX/include, $PREFIX/lib/libdnnl.so.3, $PREFIX/lib/cmake/dnnl: what
# conda-forge's onednn installs) and no oneDNN wheel; then the recipe's tests
# (import, pip check, conda/run_test.py) with no LD_LIBRARY_PATH, so that
# libdnnl.so.3 is found through the extension's rpath into $PREFIX/lib.
#
#   conda/check_prefix_build.sh            (make conda-check)
#
# Environment: ONEDNN_FROM, a venv with onednn-devel-cpu-gomp and onednn-cpu-gomp
# whose files are copied (default: the repository's .venv); QPACK_QNNPACK_SOURCE_DIR
# (default: third_party/.cache/qnnpack, filled by third_party/fetch_qnnpack.sh);
# CONDA_CHECK_DIR (default: build/conda-check); JOBS (default 1); PYTHON3.
# QNNPACK's dependencies come from the system (Debian's lib*-dev) here, where
# the recipe builds the copies bundled in PyTorch's archive instead.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
onednn_from="${ONEDNN_FROM:-$repo/.venv}"
qnnpack="${QPACK_QNNPACK_SOURCE_DIR:-$repo/third_party/.cache/qnnpack}"
work="${CONDA_CHECK_DIR:-$repo/build/conda-check}"
prefix="$work/prefix"
t0=$SECONDS
step() { echo "conda-check: [$((SECONDS - t0)) s] $*"; }
die() { echo "conda-check: FAILED: $*" >&2; exit 1; }

[[ -f "$qnnpack/include/qnnpack_func.h" ]] \
  || die "no QNNPACK source at $qnnpack (run third_party/fetch_qnnpack.sh or set QPACK_QNNPACK_SOURCE_DIR)"
rm -rf "$work"
mkdir -p "$work"

step "host prefix $prefix: python and the recipe's host requirements, no oneDNN wheel"
"${PYTHON3:-python3}" -m venv "$prefix"
"$prefix/bin/python" -m pip install -q "scikit-build-core>=0.10" "cython>=3.0" "numpy>=1.22" \
  ninja "cmake>=3.18"
# The recipe's run requirements besides numpy and oneDNN (python-xxhash, click, tqdm).
"$prefix/bin/python" -m pip install -q "xxhash>=3" "click>=8" "tqdm>=4"

step "oneDNN's files from the wheels in $onednn_from, copied into the prefix as conda lays them out"
"$prefix/bin/python" - "$onednn_from" "$prefix" <<'EOF'
import csv, glob, os, shutil, sys
src, dst = (os.path.realpath(p) for p in sys.argv[1:3])
records = [r for d in ("onednn_devel_cpu_gomp", "onednn_cpu_gomp")
           for r in glob.glob(f"{src}/lib/python3*/site-packages/{d}-*.dist-info/RECORD")]
if len(records) != 2:
    sys.exit(f"conda-check: onednn-devel-cpu-gomp and onednn-cpu-gomp wheels not both in {src}")
n = 0
for rec in records:
    site = os.path.dirname(os.path.dirname(rec))
    for row in csv.reader(open(rec)):
        path = os.path.realpath(os.path.join(site, row[0]))
        rel = os.path.relpath(path, src)
        if rel.split(os.sep)[0] in ("include", "lib") and "site-packages" not in rel:
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(path, os.path.join(dst, rel))
            n += 1
print(f"conda-check: copied {n} files (include/, lib/libdnnl.so*, lib/cmake/dnnl)")
EOF
[[ -f "$prefix/lib/libdnnl.so.3" && -f "$prefix/lib/cmake/dnnl/dnnl-config.cmake" ]] \
  || die "oneDNN files missing in $prefix"
if "$prefix/bin/python" -m pip list 2>/dev/null | grep -qi onednn; then
  die "a oneDNN wheel is installed in $prefix"
fi

step "the source as rattler-build's path source copies it (git's view, ignored files left out)"
mkdir -p "$work/src"
(cd "$repo" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -C "$work/src" -xf -

step "CMake alone (no Python, so no Python-prefix hints) finds oneDNN through CMAKE_PREFIX_PATH only"
configure() {  # configure the C++ core in $work/cfg with the extra arguments given
  rm -rf "$work/cfg"
  env -u VIRTUAL_ENV -u CONDA_PREFIX -u PREFIX nice -n 10 "$prefix/bin/cmake" -S "$work/src" \
    -B "$work/cfg" -G Ninja -DCMAKE_MAKE_PROGRAM="$prefix/bin/ninja" \
    -DQPACK_QNNPACK_SOURCE_DIR="$qnnpack" "$@" >"$work/cfg.log" 2>&1
}
configure -DCMAKE_PREFIX_PATH="$prefix" || { cat "$work/cfg.log"; die "configure with CMAKE_PREFIX_PATH failed"; }
grep -q "qpack: oneDNN .* from $prefix/lib/cmake/dnnl" "$work/cfg.log" || die "CMAKE_PREFIX_PATH not used"
configure -Ddnnl_DIR="$prefix/lib/cmake/dnnl" || { cat "$work/cfg.log"; die "configure with dnnl_DIR failed"; }
if configure; then die "configure found a oneDNN without being told where (a system copy?)"; fi
grep -q "oneDNN >= 3.2 (dnnl-config.cmake) not found" "$work/cfg.log" || die "unexpected configure error"
rm -rf "$work/cfg"

step "conda/build.sh (CMAKE_ARGS=-DCMAKE_PREFIX_PATH=\$PREFIX, -j${JOBS:-1}), log in $work/build.log"
(
  cd "$work/src"
  env -u VIRTUAL_ENV -u CONDA_PREFIX -u LD_LIBRARY_PATH \
    PYTHON="$prefix/bin/python" PREFIX="$prefix" SRC_DIR="$work/src" \
    PATH="$prefix/bin:$PATH" \
    CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$prefix -DCMAKE_INSTALL_PREFIX=$prefix -DCMAKE_INSTALL_LIBDIR=lib" \
    QPACK_QNNPACK_DEPS=system QPACK_QNNPACK_SOURCE_DIR="$qnnpack" \
    SKBUILD_BUILD_DIR="$work/build" CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-1}" \
    nice -n 10 bash "$repo/conda/build.sh"
) >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; die "build.sh failed (log: $work/build.log)"; }
grep -q "qpack: oneDNN .* from $prefix/lib/cmake/dnnl (prefix $prefix;" "$work/build.log" \
  || { grep "qpack: oneDNN" "$work/build.log" || true; die "oneDNN was not taken from $prefix"; }
grep "qpack: oneDNN" "$work/build.log" | sed 's/^.*qpack:/conda-check: CMake found/'

step "rpath: libdnnl.so.3 from \$PREFIX/lib, without LD_LIBRARY_PATH"
core="$(ls "$prefix"/lib/python3*/site-packages/qpack/_core*.so)"
readelf -d "$core" | grep -E "RUNPATH|RPATH" | sed 's/^ */conda-check: /'
dnnl="$(env -u LD_LIBRARY_PATH ldd "$core" | awk '/libdnnl.so.3/ {print $3}')"
[[ "$(realpath "$dnnl")" == "$(realpath "$prefix/lib/libdnnl.so.3")" ]] \
  || die "_core resolves libdnnl.so.3 to '$dnnl', not $prefix/lib/libdnnl.so.3"
echo "conda-check: $(basename "$core") -> $dnnl"

step "the recipe's tests"
cd "$work"
env -u LD_LIBRARY_PATH -u PYTHONPATH "$prefix/bin/python" -c "import qpack"
env -u LD_LIBRARY_PATH "$prefix/bin/python" -m pip check
env -u LD_LIBRARY_PATH -u PYTHONPATH "$prefix/bin/python" "$repo/conda/run_test.py"
step "passed"
