// The one interface every packed op of the core implements.
//
//   OpSpec        what every op with weights shares: mode, backend, weight
//                 quantization, bias, fused clamp, static int8 input/output.
//                 An op's spec derives from it and adds its geometry
//                 (LinearSpec: K, N; ConvSpec: channels, kernel, stride ...).
//   Counters      what a packed object counts, with one meaning on every
//                 backend and mode (see qpack_linear_stats in qpack.h).
//   Kernel        a backend's packed weights for one op: immutable, const
//                 methods only, safe from many threads. An op's kernel
//                 interface (LinearKernel, ConvKernel) derives from it and
//                 adds the op's run methods.
//   PackedOp<S,K> the lifetime holder behind a C handle (core/packed_op.h):
//                 spec, kernel (from the backend registry, core/registry.h),
//                 original weights while retained, unpack from the packed form.
//
// To add an op: a spec deriving OpSpec with its make_*_spec (validation), a
// kernel interface deriving Kernel, one file per backend implementing it, a
// factory slot in core/registry.h, and its extern "C" functions in src/api/
// (api/handle.h gives the lifetime functions every handle shares).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "qpack/qpack.h"

namespace qpack {

// Parts of a packed op's parameters that do not depend on its geometry.
// Immutable once the op is built.
struct OpSpec {
  qpack_mode mode = QPACK_MODE_F32;
  qpack_backend backend = QPACK_BACKEND_AUTO;  // resolved: never AUTO once built
  std::vector<float> weight_scales;            // int8: 1 or one per output channel
  std::vector<int32_t> weight_zero_points;     // int8: same length as scales
  std::vector<float> bias;                     // empty or one per output channel
  float clamp_min = 0, clamp_max = 0;          // real domain; +-inf when absent
  float input_scale = 0;                       // static: expected (0 = given per call)
  int32_t input_zero_point = 0;
  float output_scale = 0;                      // static
  int32_t output_zero_point = 0;

  bool per_channel() const { return weight_scales.size() > 1; }
  float weight_scale(int64_t n) const { return weight_scales[per_channel() ? n : 0]; }
  int32_t weight_zero_point(int64_t n) const {
    return weight_zero_points[per_channel() ? n : 0];
  }
  size_t weight_elem_size() const { return mode == QPACK_MODE_F32 ? 4 : 1; }
  bool int8() const { return mode != QPACK_MODE_F32; }
  bool static_int8() const { return mode == QPACK_MODE_INT8_STATIC; }
};

// The C API's params structs share these fields by name; one parser fills
// the OpSpec of any of them (validated; throws qpack::Error).
struct OpParams {
  qpack_mode mode;
  qpack_backend backend;
  const float* weight_scales;
  const int32_t* weight_zero_points;
  int64_t num_weight_scales;
  const float* bias;
  float clamp_min, clamp_max;
  float input_scale;
  int32_t input_zero_point;
  float output_scale;
  int32_t output_zero_point;

  template <typename P>
  static OpParams of(const P& p) {
    return OpParams{p.mode,      p.backend,         p.weight_scales,   p.weight_zero_points,
                    p.num_weight_scales, p.bias,    p.clamp_min,       p.clamp_max,
                    p.input_scale, p.input_zero_point, p.output_scale, p.output_zero_point};
  }
};

enum class OpKind { linear, conv2d };
const char* op_name(OpKind op);  // "linear", "convolution"

// Validates the shared parameters of an op with `channels` output channels
// (`unit` names one in messages: "feature", "channel") and `weight_count`
// weights into spec, and resolves the backend through the registry. A null
// weight with !weight_given: the spec of a saved op (its weights are packed).
void parse_op_spec(const OpParams& p, OpKind op, const void* weight, int64_t weight_count,
                   int64_t channels, const char* unit, OpSpec* spec, bool weight_given = true);

// Run entry points (LinearKernel::run_f32 ...): the input kind must match
// the mode (uint8 exactly for static int8), else INVALID_TYPE.
void check_run_mode(const OpSpec& spec, OpKind op, bool u8_input);
// A static run's input scale and zero point, else INVALID_ARGUMENT.
void check_input_qparams(float input_scale, int32_t input_zero_point);
// A backend registered a mode it does not run: INTERNAL.
[[noreturn]] void not_run(const OpSpec& spec, OpKind op);

// Counters of one packed object. Each run counts once in `runs` and, when
// everything it needed was already built, once in `cache_hits`.
struct Counters {
  std::atomic<uint64_t> states_built{0};  // packed states built, first pack included
  std::atomic<uint64_t> cache_hits{0};    // runs that built nothing
  std::atomic<uint64_t> evictions{0};     // entries dropped from a bounded cache
  std::atomic<uint64_t> runs{0};
  std::atomic<uint64_t> split_runs{0};  // int8 runs split to stay exact without VNNI

  void built() { states_built.fetch_add(1, std::memory_order_relaxed); }
  void hit() { cache_hits.fetch_add(1, std::memory_order_relaxed); }
  void evicted() { evictions.fetch_add(1, std::memory_order_relaxed); }
  void ran() { runs.fetch_add(1, std::memory_order_relaxed); }
  void ran_split() { split_runs.fetch_add(1, std::memory_order_relaxed); }
};

// Read-only bytes kept valid by `owner` (a mapped model file, or a heap copy).
struct Blob {
  std::shared_ptr<const void> owner;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// A kernel's packed weights as a model file stores them (docs/FORMAT.md):
// the backend's description of the layout, and the bytes the kernels read
// (kept alive by `keep` while the form is used).
struct PackedForm {
  std::vector<uint8_t> layout;
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keep;
};

// What a backend's loader gets back from a file: the saved layout and packed
// bytes. Equal to the layout this machine's kernels want, the bytes are used
// in place; otherwise the weight is decoded from them and re-packed (then
// `repacked` is set), or refused with FILE_FORMAT when !allow_repack.
struct SavedForm {
  std::vector<uint8_t> layout;
  Blob packed;
  bool allow_repack = true;
  bool same_build = true;  // packed by this build's packing code (else never used in place)
  std::string other_build;  // another build or ISA: "packed by X for Y; this is Z on W", in messages
  std::string what;  // "op 3 (linear)", in messages
  mutable bool repacked = false;
  mutable std::string why;  // what differed, when repacked
};
// The layouts differ: records why for a re-pack, or throws FILE_FORMAT when
// the form does not allow one.
void layout_differs(const SavedForm& form, const std::string& why);

// A backend's packed weights for one op.
class Kernel {
 public:
  virtual ~Kernel() = default;
  // Writes the weight in the op's plain layout (float or int8 by mode),
  // reconstructed from the packed form.
  virtual void unpack_weight(void* out) const = 0;
  virtual size_t nbytes_packed() const = 0;
  // The packed weights as a model file stores them.
  virtual PackedForm packed_form() const = 0;
  const Counters& counters() const { return counters_; }

 protected:
  mutable Counters counters_;  // kernels are const; counting is not state
};

// The original weight bytes while retained: a copy, or a view of a mapped
// model file (shared between processes). Thread-safe; runs never touch it.
class OriginalWeights {
 public:
  void keep(const void* weight, size_t nbytes);
  void keep_view(Blob view);
  void release();          // idempotent
  bool held() const;
  size_t nbytes() const;   // 0 once released
  // Copies the original into out and returns true, or returns false if released.
  bool copy_to(void* out) const;

 private:
  mutable std::mutex mutex_;
  Blob bytes_;  // empty once released (weights are never empty)
};

// bias [channels] into out, zeros when there is no bias.
void copy_bias(const std::vector<float>& bias, int64_t channels, float* out);

}  // namespace qpack
