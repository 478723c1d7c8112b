// Errors inside the core: one exception type carrying a qpack_status. The C
// API (src/api) catches it at the boundary and turns it into a status code
// plus a thread-local message. Nothing else crosses the C boundary.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "qpack/qpack.h"

namespace qpack {

class Error : public std::runtime_error {
 public:
  Error(qpack_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  qpack_status status() const { return status_; }

 private:
  qpack_status status_;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, T&& first, Rest&&... rest) {
  os << std::forward<T>(first);
  append(os, std::forward<Rest>(rest)...);
}
}  // namespace detail

// fail(QPACK_STATUS_INVALID_ARGUMENT, "weight has ", n, " rows; expected ", m)
template <typename... Parts>
[[noreturn]] void fail(qpack_status status, Parts&&... parts) {
  std::ostringstream os;
  detail::append(os, std::forward<Parts>(parts)...);
  throw Error(status, os.str());
}

template <typename... Parts>
void check(bool ok, qpack_status status, Parts&&... parts) {
  if (!ok) fail(status, std::forward<Parts>(parts)...);
}

}  // namespace qpack
