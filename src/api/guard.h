// The C boundary's error handling, shared by every api/*.cc file: run a body,
// catch every C++ exception, and turn it into a status plus a thread-local
// message (qpack_last_error).
#pragma once

#include <exception>
#include <new>
#include <string>

#include "core/error.h"
#include "qpack/qpack.h"

namespace qpack {
namespace api {

inline std::string& last_error() {
  thread_local std::string message;
  return message;
}

inline qpack_status set_error(qpack_status status, const char* message) {
  last_error() = message;
  return status;
}

template <typename F>
qpack_status guarded(F&& f) {
  try {
    f();
    last_error().clear();
    return QPACK_STATUS_SUCCESS;
  } catch (const qpack::Error& e) {
    return set_error(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return set_error(QPACK_STATUS_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return set_error(QPACK_STATUS_INTERNAL, e.what());
  } catch (...) {
    return set_error(QPACK_STATUS_INTERNAL, "unknown C++ exception");
  }
}

}  // namespace api
}  // namespace qpack
