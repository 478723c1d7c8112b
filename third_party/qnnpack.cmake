# PyTorch's QNNPACK (pytorch_qnnpack), built from source as a static PIC library.
# Source: QPACK_QNNPACK_SOURCE_DIR, or the cache that third_party/fetch_qnnpack.sh fills.
set(QPACK_QNNPACK_SOURCE_DIR "" CACHE PATH
  "Path to aten/src/ATen/native/quantized/cpu/qnnpack of PyTorch 1.13 (default: run third_party/fetch_qnnpack.sh)")
if(NOT QPACK_QNNPACK_SOURCE_DIR AND DEFINED ENV{QPACK_QNNPACK_SOURCE_DIR})
  set(QPACK_QNNPACK_SOURCE_DIR "$ENV{QPACK_QNNPACK_SOURCE_DIR}")
endif()
if(NOT QPACK_QNNPACK_SOURCE_DIR)
  set(_cache "${CMAKE_CURRENT_LIST_DIR}/.cache/qnnpack")
  if(NOT EXISTS "${_cache}/CMakeLists.txt")
    message(STATUS "qpack: fetching the QNNPACK source with third_party/fetch_qnnpack.sh")
    execute_process(COMMAND bash "${CMAKE_CURRENT_LIST_DIR}/fetch_qnnpack.sh"
      RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "qpack: third_party/fetch_qnnpack.sh failed; set QPACK_QNNPACK_SOURCE_DIR "
        "to a checkout of aten/src/ATen/native/quantized/cpu/qnnpack (PyTorch 1.13).")
    endif()
  endif()
  set(QPACK_QNNPACK_SOURCE_DIR "${_cache}")
endif()
if(NOT EXISTS "${QPACK_QNNPACK_SOURCE_DIR}/include/qnnpack_func.h")
  message(FATAL_ERROR "qpack: ${QPACK_QNNPACK_SOURCE_DIR} is not a pytorch_qnnpack source tree "
    "(no include/qnnpack_func.h). Run third_party/fetch_qnnpack.sh or fix QPACK_QNNPACK_SOURCE_DIR.")
endif()
# cpuinfo and pthreadpool: the system's (Debian's lib*-dev, or the aarch64 sysroot
# of cmake/toolchains/aarch64-linux-gnu.cmake), or sources that QNNPACK builds
# statically with itself when CPUINFO_SOURCE_DIR / PTHREADPOOL_SOURCE_DIR are given
# (Android: the NDK has neither library).
if(DEFINED PTHREADPOOL_SOURCE_DIR)
  set(USE_SYSTEM_PTHREADPOOL OFF CACHE BOOL "" FORCE)
else()
  find_path(_qpack_pthreadpool_h pthreadpool.h)
  if(NOT _qpack_pthreadpool_h)
    message(FATAL_ERROR "qpack: pthreadpool.h not found; install Debian's libpthreadpool-dev "
      "(third_party/fetch_qnnpack.sh does) or pass -DPTHREADPOOL_SOURCE_DIR=<pthreadpool source>.")
  endif()
  set(USE_SYSTEM_PTHREADPOOL ON CACHE BOOL "" FORCE)
endif()
if(DEFINED CPUINFO_SOURCE_DIR)
  set(USE_SYSTEM_CPUINFO OFF CACHE BOOL "" FORCE)
else()
  find_library(_qpack_cpuinfo_lib cpuinfo)
  if(NOT _qpack_cpuinfo_lib)
    message(FATAL_ERROR "qpack: libcpuinfo not found; install Debian's libcpuinfo-dev "
      "(third_party/fetch_qnnpack.sh does) or pass -DCPUINFO_SOURCE_DIR=<cpuinfo source>.")
  endif()
  set(USE_SYSTEM_CPUINFO ON CACHE BOOL "" FORCE)
endif()
# FP16, FXdiv, psimd: header-only. The system's headers (Debian's libfp16-dev,
# libfxdiv-dev, libpsimd-dev), or, where the toolchain cannot search the host's
# /usr/include (the Android NDK), QPACK_HEADER_ONLY_DEPS_DIR: a directory holding
# fp16.h, fp16/, fxdiv.h and psimd.h (make android links Debian's there).
set(QPACK_HEADER_ONLY_DEPS_DIR "" CACHE PATH "Directory with fp16.h, fp16/, fxdiv.h, psimd.h")
if(QPACK_HEADER_ONLY_DEPS_DIR)
  set(FP16_HDR "${QPACK_HEADER_ONLY_DEPS_DIR}/fp16.h" CACHE FILEPATH "" FORCE)
  set(FXDIV_HDR "${QPACK_HEADER_ONLY_DEPS_DIR}/fxdiv.h" CACHE FILEPATH "" FORCE)
  set(PSIMD_HDR "${QPACK_HEADER_ONLY_DEPS_DIR}/psimd.h" CACHE FILEPATH "" FORCE)
  include_directories(SYSTEM "${QPACK_HEADER_ONLY_DEPS_DIR}")
endif()
set(USE_SYSTEM_FP16 ON CACHE BOOL "" FORCE)
set(USE_SYSTEM_FXDIV ON CACHE BOOL "" FORCE)
set(USE_SYSTEM_PSIMD ON CACHE BOOL "" FORCE)
set(PYTORCH_QNNPACK_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(PYTORCH_QNNPACK_BUILD_BENCHMARKS OFF CACHE BOOL "" FORCE)
set(PYTORCH_QNNPACK_LIBRARY_TYPE "static" CACHE STRING "" FORCE)
# qpack runs QNNPACK's parallel loops on OpenMP (src/backends/qnnpack/threadpool_omp.cc),
# the runtime oneDNN and PyTorch use, instead of a second thread pool; with
# QPACK_OPENMP=OFF they run on pthreadpool itself.
set(PYTORCH_QNNPACK_CUSTOM_THREADPOOL ${QPACK_OPENMP} CACHE BOOL "" FORCE)
# QNNPACK's bundled clog asks for CMake 3.1, which CMake 4 refuses.
if(CMAKE_VERSION VERSION_GREATER_EQUAL 4.0 AND NOT DEFINED CMAKE_POLICY_VERSION_MINIMUM)
  set(CMAKE_POLICY_VERSION_MINIMUM 3.5)
endif()
set(_qpack_saved_pic ${CMAKE_POSITION_INDEPENDENT_CODE})
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
add_subdirectory("${QPACK_QNNPACK_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/pytorch_qnnpack" EXCLUDE_FROM_ALL SYSTEM)
set(CMAKE_POSITION_INDEPENDENT_CODE ${_qpack_saved_pic})
set_target_properties(pytorch_qnnpack clog PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_compile_options(pytorch_qnnpack PRIVATE -w)
target_compile_options(clog PRIVATE -w)

# The micro-kernel family QNNPACK's CMake chose for this target (qpack_get_build_info).
get_target_property(_qpack_qnnpack_srcs pytorch_qnnpack SOURCES)
set(QPACK_QNNPACK_KERNELS "")
set(_qpack_nkernels 0)
set(_qpack_klist "")
foreach(_s IN LISTS _qpack_qnnpack_srcs)
  if(_s MATCHES "(aarch64|aarch32|neon|sse2)")
    math(EXPR _qpack_nkernels "${_qpack_nkernels} + 1")
    string(APPEND _qpack_klist "${_s}\n")
  endif()
endforeach()
file(WRITE "${CMAKE_BINARY_DIR}/qnnpack_kernel_sources.txt" "${_qpack_klist}")
foreach(_family aarch64 aarch32 sse2)
  if(NOT QPACK_QNNPACK_KERNELS AND _qpack_qnnpack_srcs MATCHES "${_family}")
    set(QPACK_QNNPACK_KERNELS "${_family}")
  endif()
endforeach()
if(QPACK_QNNPACK_KERNELS MATCHES "^aarch")
  string(APPEND QPACK_QNNPACK_KERNELS "-neon")
endif()
message(STATUS "qpack: QNNPACK micro-kernels ${QPACK_QNNPACK_KERNELS} (${_qpack_nkernels} kernel sources, "
  "listed in ${CMAKE_BINARY_DIR}/qnnpack_kernel_sources.txt)")
