// QNNPACK's own operators for u8 graph nodes (core/graph_op.h): add, max /
// average / global-average pooling, clamp, sigmoid and hardswish, on the
// NHWC uint8 values a frozen graph keeps between its QNNPACK convolutions.
//
// Which parameters QNNPACK takes (pytorch_qnnpack.h and the operator
// sources) is checked here first, so that QNNPACK never logs a rejection; a
// node it does not take runs in the core's C++ code:
//   - add: each input-to-output scale ratio in [2^-14, 2^8); a fused ReLU or
//     clamp becomes its u8 output range, which must not be empty. Other fused
//     activations: not taken.
//   - max pooling: any kernel but 1x1; QNNPACK pads symmetrically with the
//     top/left padding and reads clamped input coordinates (the padding never
//     wins a max), so it is taken when its output size (floor, 2 * padding)
//     is the plan's; ceil_mode included when it adds no window.
//   - average pooling: symmetric padding, kernel not 1x1 and below 2^22
//     taps, input-to-output scale ratio in [2^-8, 2^8). QNNPACK divides by
//     the full kernel area and pads with the input zero point: PyTorch's
//     count_include_pad=True, the same as False when there is no padding;
//     no ceil_mode windows (taken when ceil_mode adds none).
//   - global average pooling: rank-4 input, H * W below 2^22 (its int32
//     sums and its scale / (H * W) stay in range), scale ratio in [2^-8, 2^8).
//   - clamp (ReLU, clamp): input and output with the same parameters.
//   - sigmoid: output scale 1/256 and zero point 0 (PyTorch's fixed
//     quantization of sigmoid); hardswish: any parameters.
//
// Rounding, as QNNPACK computes it (within one quantum of qpack's C++ code,
// which rounds the float result half to even):
//   - add: fixed point. a * ma + b * mb + c in int32 with multipliers of the
//     scale ratios to 22 bits, shifted right rounding to nearest, ties away
//     from zero (SSE2 and NEON alike), plus the output zero point, clamped.
//   - average and global-average pooling: int32 sum minus zero point times
//     taps, times the float scale in_scale / (out_scale * taps), rounded to
//     nearest, ties to even (SSE2 cvtps; NEON vcvtn or its magic-number add).
//   - sigmoid and hardswish: a 256-entry table made at create, each entry
//     lrintf (ties to even under the default rounding mode) of the float
//     result, clamped; the same as qpack's table up to float rounding.
//   - max pooling and clamp: exact.
//
// Threads: QNNPACK's setup writes the run's pointers and sizes (and, for
// pooling, an indirection buffer) into the operator, so a run never shares
// one: each node keeps a few operator instances in atomic slots; a run takes
// one (an exchange: no lock), sets it up, runs it on the calling thread's
// pool and puts it back. A thread starts at its own slot, so it usually gets
// the instance it used last, whose indirection buffer QNNPACK reuses when
// the input pointer and size are the same. Concurrent runs beyond the slots
// make their own instance and delete it after.
#include <pytorch_qnnpack.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <memory>

#include "backends/qnnpack/conv_operator.h"
#include "backends/qnnpack/runtime.h"
#include "core/error.h"
#include "core/graph_op.h"
#include "core/quant.h"

namespace qpack {
namespace qnnpack_rt {
namespace {

constexpr int64_t kMaxTaps = int64_t(1) << 22;

bool scale_ratio_in(float in, float out, float lo, float hi) {
  const float r = in / out;
  return r >= lo && r < hi;
}

void check_qnnp(pytorch_qnnp_status status, const char* what) {
  check(status == pytorch_qnnp_status_success,
        status == pytorch_qnnp_status_out_of_memory ? QPACK_STATUS_OUT_OF_MEMORY
                                                    : QPACK_STATUS_BACKEND_ERROR,
        "QNNPACK ", what, " failed with status ", static_cast<int>(status));
}

// A node's idle operator instances (see the top of this file).
class OperatorPool {
 public:
  struct Instance {
    Operator op;
    size_t channels;
  };
  using Make = pytorch_qnnp_status (*)(const GraphOpDesc&, size_t channels, pytorch_qnnp_operator_t*);

  // An instance taken from the pool for one run, put back when it ends.
  class Lease {
   public:
    Lease(const OperatorPool& pool, std::unique_ptr<Instance> inst) : pool_(pool), inst_(std::move(inst)) {}
    ~Lease() { pool_.give(std::move(inst_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    pytorch_qnnp_operator_t get() const { return inst_->op.get(); }

   private:
    const OperatorPool& pool_;
    std::unique_ptr<Instance> inst_;
  };

  OperatorPool(const GraphOpDesc& desc, Make make) : desc_(desc), make_(make) {
    for (auto& s : slots_) s.store(nullptr);
  }
  ~OperatorPool() {
    for (auto& s : slots_) delete s.exchange(nullptr);
  }

  // An instance over `channels`: an idle one, or a new one.
  Lease take(size_t channels) const {
    const unsigned home = home_slot();
    for (unsigned k = 0; k < kSlots; ++k) {
      std::unique_ptr<Instance> inst(slots_[(home + k) % kSlots].exchange(nullptr));
      if (inst == nullptr) continue;
      if (inst->channels == channels) return Lease(*this, std::move(inst));
      give(std::move(inst));  // another shape's: back where it can be found
      break;
    }
    pytorch_qnnp_operator_t raw = nullptr;
    check_qnnp(make_(desc_, channels, &raw), "operator create");
    auto inst = std::make_unique<Instance>();
    inst->op.reset(raw);
    inst->channels = channels;
    return Lease(*this, std::move(inst));
  }

 private:
  static constexpr unsigned kSlots = 8;

  static unsigned home_slot() {
    static std::atomic<unsigned> next{0};
    thread_local const unsigned home = next.fetch_add(1) % kSlots;
    return home;
  }

  void give(std::unique_ptr<Instance> inst) const {
    if (inst == nullptr) return;
    const unsigned home = home_slot();
    for (unsigned k = 0; k < kSlots; ++k) {
      Instance* expected = nullptr;
      if (slots_[(home + k) % kSlots].compare_exchange_strong(expected, inst.get())) {
        (void)inst.release();
        return;
      }
    }  // every slot taken: this one is deleted
  }

  const GraphOpDesc desc_;
  const Make make_;
  mutable std::atomic<Instance*> slots_[kSlots];
};

// A node on QNNPACK operators made by `make` for its parameters.
class QnnpackGraphOp : public GraphOp {
 public:
  QnnpackGraphOp(const GraphOpDesc& desc, OperatorPool::Make make) : desc_(desc), pool_(desc, make) {}

 protected:
  const GraphOpDesc desc_;
  const OperatorPool pool_;
};

// The u8 range of a fused activation (none, ReLU, clamp) in the output's parameters.
void act_bounds(const GraphOpDesc& d, uint8_t* lo, uint8_t* hi) {
  *lo = 0;
  *hi = 255;
  if (d.act == QPACK_ACT_RELU) {
    output_bounds_u8(0.0f, std::numeric_limits<float>::infinity(), d.y.scale, d.y.zero_point, lo, hi);
  } else if (d.act == QPACK_ACT_CLAMP) {
    output_bounds_u8(d.act_min, d.act_max, d.y.scale, d.y.zero_point, lo, hi);
  }
}

uint8_t u8(int32_t zero_point) { return static_cast<uint8_t>(zero_point); }

// ---- elementwise: add, clamp, sigmoid, hardswish (the whole value as one row) ----------

// Elementwise operators see the value as `count` pixels of one channel:
// QNNPACK then runs its contiguous path over the bytes.
class Elementwise final : public QnnpackGraphOp {
 public:
  using Setup = pytorch_qnnp_status (*)(pytorch_qnnp_operator_t, size_t, const uint8_t*,
                                        const uint8_t*, uint8_t*);
  Elementwise(const GraphOpDesc& desc, OperatorPool::Make make, Setup setup)
      : QnnpackGraphOp(desc, make), setup_(setup) {}

  bool accepts(const Shape&, const Shape&) const override { return true; }

  void run(const Shape& xs, const Shape&, const uint8_t* x0, const uint8_t* x1,
           uint8_t* out) const override {
    auto op = pool_.take(1);
    check_qnnp(setup_(op.get(), static_cast<size_t>(xs.numel()), x0, x1, out), "setup");
    check_qnnp(pytorch_qnnp_run_operator(op.get(), thread_pool()), "run");
  }

 private:
  const Setup setup_;
};

pytorch_qnnp_status make_add(const GraphOpDesc& d, size_t channels, pytorch_qnnp_operator_t* op) {
  uint8_t lo, hi;
  act_bounds(d, &lo, &hi);
  return pytorch_qnnp_create_add_nc_q8(channels, u8(d.x.zero_point), d.x.scale, u8(d.x1.zero_point),
                                       d.x1.scale, u8(d.y.zero_point), d.y.scale, lo, hi, 0, op);
}
pytorch_qnnp_status setup_add(pytorch_qnnp_operator_t op, size_t n, const uint8_t* a,
                              const uint8_t* b, uint8_t* y) {
  return pytorch_qnnp_setup_add_nc_q8(op, n, a, 1, b, 1, y, 1);
}

pytorch_qnnp_status make_clamp(const GraphOpDesc& d, size_t channels, pytorch_qnnp_operator_t* op) {
  uint8_t lo, hi;
  act_bounds(d, &lo, &hi);
  return pytorch_qnnp_create_clamp_nc_u8(channels, lo, hi, 0, op);
}
pytorch_qnnp_status make_sigmoid(const GraphOpDesc& d, size_t channels, pytorch_qnnp_operator_t* op) {
  return pytorch_qnnp_create_sigmoid_nc_q8(channels, u8(d.x.zero_point), d.x.scale, u8(d.y.zero_point),
                                           d.y.scale, 0, 255, 0, op);
}
pytorch_qnnp_status make_hardswish(const GraphOpDesc& d, size_t channels, pytorch_qnnp_operator_t* op) {
  return pytorch_qnnp_create_hardswish_nc_q8(channels, u8(d.x.zero_point), d.x.scale,
                                             u8(d.y.zero_point), d.y.scale, 0, 255, 0, op);
}
// clamp, sigmoid and hardswish share one setup signature.
template <pytorch_qnnp_status (*S)(pytorch_qnnp_operator_t, size_t, const uint8_t*, size_t, uint8_t*, size_t)>
pytorch_qnnp_status setup_unary(pytorch_qnnp_operator_t op, size_t n, const uint8_t* x, const uint8_t*,
                                uint8_t* y) {
  return S(op, n, x, 1, y, 1);
}

std::unique_ptr<GraphOp> add_op(const GraphOpDesc& d) {
  uint8_t lo, hi;
  act_bounds(d, &lo, &hi);
  const bool act_ok = d.act == QPACK_ACT_NONE || d.act == QPACK_ACT_RELU || d.act == QPACK_ACT_CLAMP;
  if (!act_ok || lo >= hi || !scale_ratio_in(d.x.scale, d.y.scale, 0x1.0p-14f, 0x1.0p+8f) ||
      !scale_ratio_in(d.x1.scale, d.y.scale, 0x1.0p-14f, 0x1.0p+8f)) {
    return nullptr;
  }
  return std::make_unique<Elementwise>(d, make_add, setup_add);
}

std::unique_ptr<GraphOp> clamp_op(const GraphOpDesc& d) {
  if (d.x.scale != d.y.scale || d.x.zero_point != d.y.zero_point) return nullptr;  // requantizes
  return std::make_unique<Elementwise>(d, make_clamp, setup_unary<pytorch_qnnp_setup_clamp_nc_u8>);
}

std::unique_ptr<GraphOp> sigmoid_op(const GraphOpDesc& d) {
  if (d.y.scale != 0x1.0p-8f || d.y.zero_point != 0) return nullptr;
  return std::make_unique<Elementwise>(d, make_sigmoid, setup_unary<pytorch_qnnp_setup_sigmoid_nc_q8>);
}

std::unique_ptr<GraphOp> hardswish_op(const GraphOpDesc& d) {
  return std::make_unique<Elementwise>(d, make_hardswish, setup_unary<pytorch_qnnp_setup_hardswish_nc_q8>);
}

// ---- pooling ------------------------------------------------------------------------------

// QNNPACK's pooled size: floor, symmetric padding (pad on both sides).
int64_t floor_pooled(int64_t in, int64_t k, int64_t s, int64_t pad) {
  const int64_t span = in + 2 * pad - k;
  return span < 0 ? -1 : span / s + 1;
}

class Pool2d final : public QnnpackGraphOp {
 public:
  using Setup = pytorch_qnnp_status (*)(pytorch_qnnp_operator_t, size_t, size_t, size_t,
                                        const uint8_t*, size_t, uint8_t*, size_t, pthreadpool_t);
  Pool2d(const GraphOpDesc& desc, OperatorPool::Make make, Setup setup)
      : QnnpackGraphOp(desc, make), setup_(setup) {}

  bool accepts(const Shape& x, const Shape& y) const override {
    return x.rank == 4 && y.rank == 4 && x.d[2] > 0 && x.d[3] > 0 &&
           floor_pooled(x.d[2], desc_.kernel[0], desc_.stride[0], desc_.pad[0]) == y.d[2] &&
           floor_pooled(x.d[3], desc_.kernel[1], desc_.stride[1], desc_.pad[1]) == y.d[3];
  }

  void run(const Shape& xs, const Shape&, const uint8_t* x0, const uint8_t*, uint8_t* out) const override {
    const size_t C = static_cast<size_t>(xs.d[1]);
    auto op = pool_.take(C);
    pthreadpool_t pool = thread_pool();
    check_qnnp(setup_(op.get(), static_cast<size_t>(xs.d[0]), static_cast<size_t>(xs.d[2]),
                      static_cast<size_t>(xs.d[3]), x0, C, out, C, pool),
               "setup");
    check_qnnp(pytorch_qnnp_run_operator(op.get(), pool), "run");
  }

 private:
  const Setup setup_;
};

pytorch_qnnp_status make_max_pool(const GraphOpDesc& d, size_t channels, pytorch_qnnp_operator_t* op) {
  return pytorch_qnnp_create_max_pooling2d_nhwc_u8(
      static_cast<uint32_t>(d.pad[0]), static_cast<uint32_t>(d.pad[1]), static_cast<uint32_t>(d.kernel[0]),
      static_cast<uint32_t>(d.kernel[1]), static_cast<uint32_t>(d.stride[0]),
      static_cast<uint32_t>(d.stride[1]), 1, 1, channels, 0, 255, 0, op);
}
pytorch_qnnp_status make_avg_pool(const GraphOpDesc& d, size_t channels, pytorch_qnnp_operator_t* op) {
  return pytorch_qnnp_create_average_pooling2d_nhwc_q8(
      static_cast<uint32_t>(d.pad[0]), static_cast<uint32_t>(d.pad[1]), static_cast<uint32_t>(d.kernel[0]),
      static_cast<uint32_t>(d.kernel[1]), static_cast<uint32_t>(d.stride[0]),
      static_cast<uint32_t>(d.stride[1]), channels, u8(d.x.zero_point), d.x.scale, u8(d.y.zero_point),
      d.y.scale, 0, 255, 0, op);
}

std::unique_ptr<GraphOp> max_pool_op(const GraphOpDesc& d) {
  if (d.kernel[0] * d.kernel[1] == 1) return nullptr;
  return std::make_unique<Pool2d>(d, make_max_pool, pytorch_qnnp_setup_max_pooling2d_nhwc_u8);
}

std::unique_ptr<GraphOp> avg_pool_op(const GraphOpDesc& d) {
  const bool symmetric = d.pad[0] == d.pad[2] && d.pad[1] == d.pad[3];
  const bool padded = d.pad[0] != 0 || d.pad[1] != 0;
  const int64_t taps = d.kernel[0] * d.kernel[1];
  if (!symmetric || (padded && !d.count_include_pad) || taps == 1 || taps >= kMaxTaps ||
      !scale_ratio_in(d.x.scale, d.y.scale, 0x1.0p-8f, 0x1.0p+8f)) {
    return nullptr;
  }
  return std::make_unique<Pool2d>(d, make_avg_pool, pytorch_qnnp_setup_average_pooling2d_nhwc_q8);
}

// Global average pooling: [N, H*W, C] -> [N, C].
class GlobalAvgPool final : public QnnpackGraphOp {
 public:
  using QnnpackGraphOp::QnnpackGraphOp;

  bool accepts(const Shape& x, const Shape&) const override {
    return x.rank == 4 && x.d[2] * x.d[3] > 0 && x.d[2] * x.d[3] < kMaxTaps;
  }

  void run(const Shape& xs, const Shape&, const uint8_t* x0, const uint8_t*, uint8_t* out) const override {
    const size_t C = static_cast<size_t>(xs.d[1]);
    auto op = pool_.take(C);
    check_qnnp(pytorch_qnnp_setup_global_average_pooling_nwc_q8(
                   op.get(), static_cast<size_t>(xs.d[0]), static_cast<size_t>(xs.d[2] * xs.d[3]), x0,
                   C, out, C),
               "setup");
    check_qnnp(pytorch_qnnp_run_operator(op.get(), thread_pool()), "run");
  }
};

pytorch_qnnp_status make_global_avg_pool(const GraphOpDesc& d, size_t channels,
                                         pytorch_qnnp_operator_t* op) {
  return pytorch_qnnp_create_global_average_pooling_nwc_q8(channels, u8(d.x.zero_point), d.x.scale,
                                                           u8(d.y.zero_point), d.y.scale, 0, 255, 0, op);
}

std::unique_ptr<GraphOp> global_avg_pool_op(const GraphOpDesc& d) {
  if (!scale_ratio_in(d.x.scale, d.y.scale, 0x1.0p-8f, 0x1.0p+8f)) return nullptr;
  return std::make_unique<GlobalAvgPool>(d, make_global_avg_pool);
}

}  // namespace

GraphOps graph_ops() {
  GraphOps g;
  g.add = add_op;
  g.max_pool = max_pool_op;
  g.avg_pool = avg_pool_op;
  g.global_avg_pool = global_avg_pool_op;
  g.clamp = clamp_op;
  g.sigmoid = sigmoid_op;
  g.hardswish = hardswish_op;
  return g;
}

}  // namespace qnnpack_rt
}  // namespace qpack
