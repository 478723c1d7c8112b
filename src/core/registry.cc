#include "core/registry.h"

#include <string>

#include "core/error.h"

namespace qpack {
namespace {

const char* mode_name(qpack_mode mode) {
  switch (mode) {
    case QPACK_MODE_F32: return "float32";
    case QPACK_MODE_INT8_STATIC: return "static int8";
    case QPACK_MODE_INT8_DYNAMIC: return "dynamic int8";
  }
  return "unknown-mode";
}

bool supports(const Backend& b, OpKind op, qpack_mode mode) {
  return b.compiled() && (op_modes(b, op) & (1u << mode)) != 0;
}

// "backend='onednn'" or "backend='onednn' or 'x'"; empty when none.
std::string alternatives(OpKind op, qpack_mode mode, qpack_backend except) {
  std::string out;
  for (const auto& b : backends()) {
    if (b.id == except || !supports(b, op, mode)) continue;
    out += out.empty() ? "backend='" : " or '";
    out += b.name;
    out += "'";
  }
  return out;
}

}  // namespace

const Backend& backend(qpack_backend id) {
  for (const auto& b : backends()) {
    if (b.id == id) return b;
  }
  fail(QPACK_STATUS_INVALID_ARGUMENT, "unknown backend ", static_cast<int>(id));
}

unsigned op_modes(const Backend& b, OpKind op) {
  switch (op) {
    case OpKind::linear: return b.ops.linear.make ? b.ops.linear.modes : 0u;
    case OpKind::conv2d: return b.ops.conv2d.make ? b.ops.conv2d.modes : 0u;
  }
  return 0;
}

qpack_backend resolve_backend(qpack_backend requested, OpKind op, qpack_mode mode,
                              bool asymmetric_weights) {
  if (requested == QPACK_BACKEND_AUTO) {
    for (const auto& b : backends()) {
      if (supports(b, op, mode) && b.available() &&
          (!asymmetric_weights || b.ops.asymmetric_weights)) {
        return b.id;
      }
    }
    fail(QPACK_STATUS_UNSUPPORTED, "no backend of this build can run a ", mode_name(mode), " ",
         op_name(op), asymmetric_weights ? " with weight zero points" : "", " on this CPU");
  }
  const Backend& b = backend(requested);
  if (!b.compiled()) {
    const std::string other = alternatives(op, mode, b.id);
    fail(QPACK_STATUS_UNSUPPORTED, b.display, " is not in this build of qpack",
         other.empty() ? std::string() : "; use " + other);
  }
  if (!supports(b, op, mode)) {
    const std::string other = alternatives(op, mode, b.id);
    fail(QPACK_STATUS_UNSUPPORTED, b.display, " has no ", mode_name(mode), " ", op_name(op),
         other.empty() ? std::string("; no backend of this build has one") : "; use " + other,
         mode == QPACK_MODE_F32 ? " or quantize the weight to int8" : "");
  }
  return b.id;
}

}  // namespace qpack
