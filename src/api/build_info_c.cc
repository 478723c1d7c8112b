// extern "C": how this library was built (qpack_get_build_info).
#include <cstring>
#include <string>

#include "api/guard.h"
#include "core/error.h"
#include "qpack/qpack.h"

#ifndef QPACK_VERSION_STRING
#define QPACK_VERSION_STRING "unknown"
#endif
// Set by src/CMakeLists.txt from the micro-kernel sources QNNPACK's CMake chose.
#ifndef QPACK_QNNPACK_KERNELS
#define QPACK_QNNPACK_KERNELS ""
#endif
#ifndef QPACK_TARGET_ARCH
#define QPACK_TARGET_ARCH "unknown"
#endif
#ifndef QPACK_USE_OPENMP
#define QPACK_USE_OPENMP 1
#endif

using qpack::api::guarded;

extern "C" {

qpack_status qpack_get_build_info(qpack_build_info* info_out) {
  return guarded([&] {
    qpack::check(info_out != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "info_out is NULL");
    *info_out = qpack_build_info{};
    info_out->version = QPACK_VERSION_STRING;
    info_out->target_arch = QPACK_TARGET_ARCH;
    info_out->qnnpack_kernels = QPACK_WITH_QNNPACK ? QPACK_QNNPACK_KERNELS : "";
    info_out->threading = QPACK_USE_OPENMP ? "openmp" : "pthreadpool";
    info_out->mobile = QPACK_MOBILE ? 1 : 0;
    info_out->with_onednn = QPACK_WITH_ONEDNN ? 1 : 0;
    info_out->with_qnnpack = QPACK_WITH_QNNPACK ? 1 : 0;
  });
}

qpack_status qpack_build_info_string(char* buf, size_t size) {
  return guarded([&] {
    qpack::check(buf != nullptr && size > 0, QPACK_STATUS_INVALID_ARGUMENT, "buffer is NULL");
    qpack_build_info b;
    qpack_get_build_info(&b);
    std::string backends;
    if (b.with_onednn) backends += "onednn";
    if (b.with_qnnpack) backends += backends.empty() ? "qnnpack" : ",qnnpack";
    const std::string text = std::string("qpack ") + b.version + "; arch=" + b.target_arch +
                             "; backends=" + backends + "; qnnpack_kernels=" +
                             (b.qnnpack_kernels[0] ? b.qnnpack_kernels : "none") +
                             "; threading=" + b.threading + "; mobile=" +
                             std::to_string(b.mobile);
    std::strncpy(buf, text.c_str(), size - 1);
    buf[size - 1] = '\0';
  });
}

}  // extern "C"
