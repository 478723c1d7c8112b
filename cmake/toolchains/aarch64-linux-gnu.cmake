# Cross-compile for aarch64 Linux (arm64) with Debian's cross toolchain, and run the
# target binaries (ctest, try_run) under qemu-user. third_party/cross_deps.sh installs
# everything this file refers to.
#
#   cmake -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake ...
#
# Target libraries and headers are searched, in order, in
#   QPACK_AARCH64_SYSROOT (default third_party/.cache/aarch64/sysroot: Debian's
#     :arm64 packages that cannot be co-installed with their amd64 twins, unpacked
#     by cross_deps.sh: libcpuinfo, libpthreadpool),
#   the multiarch tree (/usr/lib/aarch64-linux-gnu, /usr/include/aarch64-linux-gnu:
#     :arm64 packages installed through dpkg --add-architecture arm64),
#   the cross toolchain's own tree /usr/aarch64-linux-gnu (libc, libstdc++),
# and, for headers only and after all of these, the host's /usr/include
# (-idirafter): architecture-independent header-only packages (libfp16-dev,
# libfxdiv-dev, libpsimd-dev) and the shared include dir of multiarch -dev packages.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(QPACK_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${QPACK_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${QPACK_CROSS_TRIPLE}-g++)
# QNNPACK's .S kernels go through the C compiler driver (cpp + as).
set(CMAKE_ASM_COMPILER ${QPACK_CROSS_TRIPLE}-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE ${QPACK_CROSS_TRIPLE})
# The toolchain's tree: the emulator's -L root (dynamic loader, libc, libstdc++).
set(QPACK_CROSS_ROOT /usr/${QPACK_CROSS_TRIPLE})

if(NOT DEFINED QPACK_AARCH64_SYSROOT)
  if(DEFINED ENV{QPACK_AARCH64_SYSROOT})
    set(QPACK_AARCH64_SYSROOT "$ENV{QPACK_AARCH64_SYSROOT}")
  else()
    get_filename_component(QPACK_AARCH64_SYSROOT
      "${CMAKE_CURRENT_LIST_DIR}/../../third_party/.cache/aarch64/sysroot" ABSOLUTE)
  endif()
endif()
# try_compile projects get a fresh cache: pass the value on.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES QPACK_AARCH64_SYSROOT)

# "/" as a root makes /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE} (the multiarch
# directory) a search location; the host's x86_64-linux-gnu directory is never
# searched, since CMAKE_LIBRARY_ARCHITECTURE is aarch64-linux-gnu.
set(CMAKE_FIND_ROOT_PATH "${QPACK_AARCH64_SYSROOT}" "${QPACK_CROSS_ROOT}" /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)   # build tools run on the host
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Header search for the compilers (which, unlike find_*, know nothing of the roots).
set(_qpack_incs "")
foreach(_d "${QPACK_AARCH64_SYSROOT}/usr/include" /usr/include/${QPACK_CROSS_TRIPLE})
  if(EXISTS "${_d}")
    list(APPEND _qpack_incs "${_d}")
  endif()
endforeach()
foreach(_lang C CXX ASM)
  set(CMAKE_${_lang}_STANDARD_INCLUDE_DIRECTORIES ${_qpack_incs})
  set(CMAKE_${_lang}_FLAGS_INIT "-idirafter /usr/include")
endforeach()
# Link: the extracted and multiarch library dirs for indirect dependencies.
# (set, not appended: CMake reads this file more than once.)
set(_qpack_link "")
foreach(_d "${QPACK_AARCH64_SYSROOT}/usr/lib/${QPACK_CROSS_TRIPLE}" /usr/lib/${QPACK_CROSS_TRIPLE})
  if(EXISTS "${_d}")
    string(APPEND _qpack_link " -Wl,-rpath-link,${_d}")
  endif()
endforeach()
set(CMAKE_EXE_LINKER_FLAGS_INIT "${_qpack_link}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "${_qpack_link}")

# Run target binaries under user-mode emulation. -L makes qemu look up the target's
# absolute paths (the dynamic loader /lib/ld-linux-aarch64.so.1, ...) under the
# toolchain's tree first and then on the host, so build-tree RPATHs into
# QPACK_AARCH64_SYSROOT and the multiarch directory /usr/lib/aarch64-linux-gnu work.
# LD_LIBRARY_PATH pins libc/libstdc++ to the toolchain's tree too: once any :arm64
# package is installed (dpkg pulls in libc6:arm64), the host's /etc/ld.so.cache and
# /lib/aarch64-linux-gnu hold a *different* glibc build (2.36-9+deb12u* vs the cross
# toolchain's 2.36-8cross1), the toolchain's loader picks that libc.so.6, and the
# mismatched pair hangs in the first pthread_create.
# binfmt_misc is not needed (and not mounted in this sandbox).
find_program(QPACK_QEMU_AARCH64 qemu-aarch64)
if(QPACK_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${QPACK_QEMU_AARCH64};-L;${QPACK_CROSS_ROOT};-E;LD_LIBRARY_PATH=${QPACK_CROSS_ROOT}/lib")
else()
  message(WARNING "qemu-aarch64 not found (install qemu-user: third_party/cross_deps.sh); "
    "target binaries will not run on this host")
endif()
