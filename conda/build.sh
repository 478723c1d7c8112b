#!/usr/bin/env bash
# conda build script of qpack (conda/recipe.yaml): rattler-build or conda-build run
# it in $SRC_DIR with $PYTHON, $PREFIX and $CMAKE_ARGS set. scikit-build-core reads
# CMAKE_ARGS itself, so the compilers, the sysroot and CMAKE_PREFIX_PATH=$PREFIX
# (where conda-forge's onednn puts lib/cmake/dnnl) reach CMake unchanged.
#
# QNNPACK comes from the second source of the recipe, PyTorch's release archive
# unpacked in $SRC_DIR/third_party/pytorch. Its dependencies (cpuinfo, pthreadpool,
# FP16, FXdiv, psimd) are not conda-forge packages, so by default they are built
# from the copies bundled in that archive (third_party/<name>) into a private
# prefix that only this build sees: cpuinfo is linked statically into qpack._core,
# the others are headers (qpack implements the pthreadpool calls on OpenMP).
#
# Environment knobs, for conda/check_prefix_build.sh and local runs:
#   QPACK_QNNPACK_SOURCE_DIR  QNNPACK's source (default: from the PyTorch archive)
#   QPACK_QNNPACK_DEPS        bundled (default) | system (already installed, e.g.
#                             Debian's lib*-dev, found on the default search paths)
set -euxo pipefail

torch_src="${QPACK_TORCH_SOURCE_DIR:-$SRC_DIR/third_party/pytorch}"
export QPACK_QNNPACK_SOURCE_DIR="${QPACK_QNNPACK_SOURCE_DIR:-$torch_src/aten/src/ATen/native/quantized/cpu/qnnpack}"
deps_mode="${QPACK_QNNPACK_DEPS:-bundled}"
qnnpack_args=()

if [[ "$deps_mode" == bundled ]]; then
  deps="$SRC_DIR/_qnnpack_deps"
  mkdir -p "$deps/include" "$deps/lib"
  cp "$torch_src/third_party/FP16/include/fp16.h" "$deps/include/"
  cp -r "$torch_src/third_party/FP16/include/fp16" "$deps/include/"
  cp "$torch_src/third_party/FXdiv/include/fxdiv.h" "$deps/include/"
  cp "$torch_src/third_party/psimd/include/psimd.h" "$deps/include/"
  # cpuinfo as a static PIC library; pthreadpool too, although QNNPACK only
  # uses its header here (PYTORCH_QNNPACK_CUSTOM_THREADPOOL) and only asks that
  # a library exist.
  # shellcheck disable=SC2086  # CMAKE_ARGS is a list of arguments
  for lib in cpuinfo pthreadpool; do
    cmake -S "$torch_src/third_party/$lib" -B "$SRC_DIR/_build_$lib" -G Ninja \
      ${CMAKE_ARGS:-} -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$deps" \
      -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCPUINFO_LIBRARY_TYPE=static -DCPUINFO_RUNTIME_TYPE=static \
      -DCPUINFO_BUILD_TOOLS=OFF -DCPUINFO_BUILD_UNIT_TESTS=OFF \
      -DCPUINFO_BUILD_MOCK_TESTS=OFF -DCPUINFO_BUILD_BENCHMARKS=OFF \
      -DPTHREADPOOL_LIBRARY_TYPE=static -DPTHREADPOOL_BUILD_TESTS=OFF \
      -DPTHREADPOOL_BUILD_BENCHMARKS=OFF \
      -DFXDIV_SOURCE_DIR="$torch_src/third_party/FXdiv"
    cmake --build "$SRC_DIR/_build_$lib" --target install
  done
  # Absolute paths, so that the find_* calls of qnnpack.cmake and of QNNPACK's
  # CMakeLists need not search (conda's CMAKE_ARGS restrict searches to $PREFIX).
  # cpuinfo's calls into clog resolve against QNNPACK's own clog, linked before it.
  qnnpack_args=(
    "-DCPUINFO_LIBRARY=$deps/lib/libcpuinfo.a"
    "-D_qpack_cpuinfo_lib=$deps/lib/libcpuinfo.a"
    "-DPTHREADPOOL_LIBRARY=$deps/lib/libpthreadpool.a"
    "-D_qpack_pthreadpool_h=$deps/include"
    "-DFP16_HDR=$deps/include/fp16.h"
    "-DFXDIV_HDR=$deps/include/fxdiv.h"
    "-DPSIMD_HDR=$deps/include/psimd.h"
  )
  export CFLAGS="${CFLAGS:-} -isystem $deps/include"
  export CXXFLAGS="${CXXFLAGS:-} -isystem $deps/include"
elif [[ "$deps_mode" != system ]]; then
  echo "build.sh: QPACK_QNNPACK_DEPS must be 'bundled' or 'system', not '$deps_mode'" >&2
  exit 2
fi

# pyproject.toml's run-time dependency on the PyPI wheel onednn-cpu-gomp is, in
# conda, the onednn package (recipe: run and run_exports): drop it from the
# metadata, or `pip check` reports it missing. (--no-build-isolation skips the
# build-system requirements, onednn-devel-cpu-gomp among them.)
sed -i.orig -e '/^dependencies = \[/,/^\]/{/"onednn-cpu-gomp[=<>!~ ]/d;}' pyproject.toml
if grep -q '"onednn-cpu-gomp' pyproject.toml; then
  echo "build.sh: could not drop onednn-cpu-gomp from pyproject.toml's dependencies" >&2
  exit 1
fi

# scikit-build-core splits CMAKE_ARGS like a shell (shlex), so quote each argument.
# Both backends on every platform (on ARM, QPACK_WITH_ONEDNN defaults to OFF).
CMAKE_ARGS="${CMAKE_ARGS:-} $(printf '%q ' "-DQPACK_QNNPACK_SOURCE_DIR=$QPACK_QNNPACK_SOURCE_DIR" \
  "-DQPACK_WITH_ONEDNN=ON" \
  ${qnnpack_args[@]+"${qnnpack_args[@]}"})"
export CMAKE_ARGS
"$PYTHON" -m pip install . --no-deps --no-build-isolation -vv
