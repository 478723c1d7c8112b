#include "core/op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/quant.h"
#include "core/registry.h"

namespace qpack {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::linear: return "linear";
    case OpKind::conv2d: return "convolution";
  }
  return "op";
}

void check_run_mode(const OpSpec& spec, OpKind op, bool u8_input) {
  if (u8_input == spec.static_int8()) return;
  if (spec.static_int8()) {
    fail(QPACK_STATUS_INVALID_TYPE, "this ", op_name(op),
         " takes uint8 input with a scale and zero point (it is a static int8 ", op_name(op),
         "); float input needs a float32 or dynamic int8 one");
  }
  fail(QPACK_STATUS_INVALID_TYPE, "this ", op_name(op),
       " takes float32 input; uint8 input needs a static int8 ", op_name(op),
       " (int8 weight with output_scale and output_zero_point)");
}

void check_input_qparams(float input_scale, int32_t input_zero_point) {
  check_scale(input_scale, "input scale", -1);
  check_u8_zero_point(input_zero_point, "input zero_point");
}

void not_run(const OpSpec& spec, OpKind op) {
  fail(QPACK_STATUS_INTERNAL, "backend ", static_cast<int>(spec.backend), " registered mode ",
       static_cast<int>(spec.mode), " for ", op_name(op), " but does not run it");
}

// ---- original weights -------------------------------------------------------

void OriginalWeights::keep(const void* weight, size_t nbytes) {
  const auto* bytes = static_cast<const uint8_t*>(weight);
  auto copy = std::make_shared<std::vector<uint8_t>>(bytes, bytes + nbytes);
  keep_view(Blob{copy, copy->data(), copy->size()});
}

void OriginalWeights::keep_view(Blob view) {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_ = std::move(view);
}

void OriginalWeights::release() {
  Blob dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  std::swap(dropped, bytes_);
}

bool OriginalWeights::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_.size > 0;
}

size_t OriginalWeights::nbytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_.size;
}

bool OriginalWeights::copy_to(void* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes_.size == 0) return false;
  std::memcpy(out, bytes_.data, bytes_.size);
  return true;
}

void copy_bias(const std::vector<float>& bias, int64_t channels, float* out) {
  if (bias.empty()) {
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(channels));
  } else {
    std::memcpy(out, bias.data(), sizeof(float) * static_cast<size_t>(channels));
  }
}

// ---- the shared parameters ----------------------------------------------------

namespace {

void parse_clamp(const OpParams& p, OpSpec* s) {
  check(!std::isnan(p.clamp_min) && !std::isnan(p.clamp_max), QPACK_STATUS_INVALID_ARGUMENT,
        "activation bounds must not be NaN");
  check(p.clamp_min < p.clamp_max, QPACK_STATUS_INVALID_ARGUMENT,
        "activation bounds need min < max, got (", p.clamp_min, ", ", p.clamp_max, ")");
  s->clamp_min = p.clamp_min;
  s->clamp_max = p.clamp_max;
}

void parse_bias(const OpParams& p, int64_t channels, OpSpec* s) {
  if (p.bias == nullptr) return;
  s->bias.assign(p.bias, p.bias + channels);
  for (int64_t n = 0; n < channels; ++n) {
    check(std::isfinite(s->bias[n]), QPACK_STATUS_INVALID_ARGUMENT,
          "bias holds NaN or infinity (bias[", n, "] = ", s->bias[n], ")");
  }
}

void parse_weight_quant(const OpParams& p, int64_t channels, const char* unit,
                        const Backend& b, OpSpec* s) {
  check(p.weight_scales != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
        "an int8 weight needs weight_scale (one float, or one per output ", unit, ")");
  const int64_t num = p.num_weight_scales;
  check(num == 1 || num == channels, QPACK_STATUS_INVALID_ARGUMENT, "weight_scale has ", num,
        " values; expected 1 (per-tensor) or ", channels, " (per-channel, one per output ", unit,
        ")");
  s->weight_scales.assign(p.weight_scales, p.weight_scales + num);
  for (int64_t i = 0; i < num; ++i) check_scale(s->weight_scales[i], "weight_scale", i);
  if (p.weight_zero_points == nullptr) {
    s->weight_zero_points.assign(static_cast<size_t>(num), 0);
    return;
  }
  s->weight_zero_points.assign(p.weight_zero_points, p.weight_zero_points + num);
  for (int64_t i = 0; i < num; ++i) {
    const int32_t zp = s->weight_zero_points[i];
    check(zp >= -128 && zp <= 127, QPACK_STATUS_INVALID_ARGUMENT, "weight zero point[", i,
          "] = ", zp, " is outside the int8 range [-128, 127]");
    check(zp == 0 || b.ops.asymmetric_weights, QPACK_STATUS_UNSUPPORTED, b.display,
          " int8 needs symmetric weights (zero point 0), got zero point ", zp,
          "; use a backend that takes asymmetric weights (backend='qnnpack')");
  }
}

void parse_static_io(const OpParams& p, OpSpec* s) {
  check_scale(p.output_scale, "output_scale", -1);
  check_u8_zero_point(p.output_zero_point, "output_zero_point");
  if (p.input_scale != 0.0f) {
    check_scale(p.input_scale, "input_scale", -1);
    check_u8_zero_point(p.input_zero_point, "input_zero_point");
  }
  s->output_scale = p.output_scale;
  s->output_zero_point = p.output_zero_point;
  s->input_scale = p.input_scale;
  s->input_zero_point = p.input_zero_point;
}

}  // namespace

void layout_differs(const SavedForm& form, const std::string& layouts) {
  const std::string why = form.other_build.empty() ? layouts : form.other_build + "; " + layouts;
  check(form.allow_repack, QPACK_STATUS_FILE_FORMAT, form.what, " was packed for another layout (",
        why, "); load without strict to re-pack it here, or freeze and save the model on this "
        "machine");
  form.repacked = true;
  form.why = why;
}

void parse_op_spec(const OpParams& p, OpKind op, const void* weight, int64_t weight_count,
                   int64_t channels, const char* unit, OpSpec* s, bool weight_given) {
  check(weight != nullptr || !weight_given, QPACK_STATUS_INVALID_ARGUMENT, "weight is NULL");
  check(p.mode == QPACK_MODE_F32 || p.mode == QPACK_MODE_INT8_STATIC ||
            p.mode == QPACK_MODE_INT8_DYNAMIC,
        QPACK_STATUS_INVALID_ARGUMENT, "unknown mode ", static_cast<int>(p.mode));
  s->mode = p.mode;
  // An int8 weight with zero points: AUTO needs a backend that takes them. Only
  // a count parse_weight_quant accepts is read (it reports any other).
  const int64_t num = p.num_weight_scales;
  const bool asymmetric = p.mode != QPACK_MODE_F32 && p.weight_zero_points != nullptr &&
                          (num == 1 || num == channels) &&
                          std::any_of(p.weight_zero_points, p.weight_zero_points + num,
                                      [](int32_t zp) { return zp != 0; });
  s->backend = resolve_backend(p.backend, op, p.mode, asymmetric);
  if (!s->int8() && weight != nullptr) {
    const float* w = static_cast<const float*>(weight);
    for (int64_t i = 0; i < weight_count; ++i) {
      check(std::isfinite(w[i]), QPACK_STATUS_INVALID_ARGUMENT,
            "weight holds NaN or infinity (element ", i, " = ", w[i], ")");
    }
  }
  parse_clamp(p, s);
  parse_bias(p, channels, s);
  if (s->int8()) parse_weight_quant(p, channels, unit, backend(s->backend), s);
  if (s->static_int8()) parse_static_io(p, s);
}

}  // namespace qpack
