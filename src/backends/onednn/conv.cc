// oneDNN convolution: fp32 and static int8 (u8 x s8 -> u8, f32 bias).
//
// The weight [OC, IC/g, KH, KW] (oihw, or goihw with groups) is reordered once
// into the layout the convolution primitive asks for (format_tag::any,
// queried for a channels-last problem of a representative size) and reordered
// back for unpack. Primitives are created per (batch, height, width, layouts)
// against that fixed packed layout (runtime.h's PrimCache); runs take no lock. NCHW data goes straight to the primitive when oneDNN has
// an optimised kernel for it, and otherwise is reordered to channels-last
// around the channels-last primitive. Every run uses a per-thread user-mode
// scratchpad.
//
// On ISAs without VNNI static int8 runs split (int8_split.h): one u8 x s8 ->
// s32 primitive over the two halves of the input stacked as 2N images, and the
// epilogue in C++. The packed layout is queried with those attributes.
// Depthwise convolutions are the exception: they sum over the kernel window
// only, and oneDNN's int8 depthwise kernels widen to 32 bits before they
// multiply (no int16 pair sums), so the fused primitive is exact there
// (tests/python/test_no_vnni.py checks it with worst-case values).
// A strided 1x1 convolution without padding runs split on the pixels it reads,
// gathered first, as a stride-1 convolution: oneDNN 3.2's AVX2 int8 1x1 kernel
// gathers them itself ("rtus") and, with more than one thread and input
// channels off a multiple of 16, returns wrong values that change from run to
// run (seen on a Zen 3: up to 119 quanta off at 24 input channels, stride 2).
// Splitting only the pixels read is also less work. Narrow inputs (every byte
// and the zero point below 128) and narrow weights (all within [-64, 64], as
// freeze's reduce_range="weights" makes them) run the fused primitive instead
// of the split one: exact too (int8_split.h), at half the work.
//
// Where the CPU has AVX-512 VNNI, static int8 depthwise convolutions and 1x1
// convolutions with few input channels run on qpack's own kernels
// (depthwise_u8.h, pointwise_u8.h: channels-last, NCHW data is reordered
// around them) where they measured faster, reading the weights in the layout
// oneDNN packed them in (checked once per packed weight, never assumed);
// elsewhere on oneDNN's. Windows over 1-3 channels (pointwise_u8.h's, where
// window_u8_fits) keep their weight plain, [OC][KH][KW][IC], which each run
// lays out for the kernel; a process without that kernel re-packs it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/onednn/depthwise_nchw_f32.h"
#include "backends/onednn/depthwise_u8.h"
#include "backends/onednn/int8_split.h"
#include "backends/onednn/own_u8.h"
#include "backends/onednn/pointwise_u8.h"
#include "backends/onednn/runtime.h"
#include "core/conv.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/quant.h"
#include "core/vec_math.h"

namespace qpack {
namespace onednn_rt {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// qpack's own kernels on this backend: static int8, and fp32 depthwise on
// planar (NCHW) data.
enum class OwnKernel { none, depthwise, depthwise_avx2, pointwise, window, depthwise_nchw_f32 };

// The own kernel that may run a convolution, by its parameters, its weights
// (narrow: all within [-64, 64]) and this CPU.
OwnKernel own_kernel_for(const ConvSpec& spec, bool narrow_weights) {
  if (spec.mode == QPACK_MODE_F32 && spec.depthwise() &&
      depthwise_nchw_f32_fits(spec.KH, spec.KW, spec.stride_w) && own_enabled("QPACK_ONEDNN_OWN_DEPTHWISE")) {
    return OwnKernel::depthwise_nchw_f32;
  }
  if (!spec.static_int8()) return OwnKernel::none;
  if (spec.depthwise() && own_enabled("QPACK_ONEDNN_OWN_DEPTHWISE")) {
    if (isa_has_avx512_vnni() &&
        depthwise_u8_fits(spec.KH, spec.KW, spec.OC, DepthwiseIsa::avx512_vnni)) {
      return OwnKernel::depthwise;
    }
    if (!isa_has_avx512_vnni() && isa_has_avx2() && narrow_weights &&
        depthwise_u8_fits(spec.KH, spec.KW, spec.OC, DepthwiseIsa::avx2)) {
      return OwnKernel::depthwise_avx2;
    }
  }
  if (!isa_has_avx512_vnni()) return OwnKernel::none;
  if (spec.groups == 1 && spec.KH == 1 && spec.KW == 1 && spec.pad_t == 0 && spec.pad_l == 0 &&
      spec.pad_b == 0 && spec.pad_r == 0 && own_u8_available() &&
      own_enabled("QPACK_ONEDNN_OWN_POINTWISE")) {
    return OwnKernel::pointwise;
  }
  if (spec.groups == 1 && spec.dil_h == 1 && spec.dil_w == 1 && window_u8_fits(spec.IC, spec.KH, spec.KW) &&
      own_u8_available() && own_enabled("QPACK_ONEDNN_OWN_WINDOW")) {
    return OwnKernel::window;
  }
  return OwnKernel::none;
}

// Packed weights in one oneDNN layout, chosen for the channels-last problem
// N x H x W; immutable once published. `own` says whether the layout is one
// the convolution's own kernel reads, found when the weights are placed.
struct Packed {
  memory mem;
  int64_t N = 1, H = 0, W = 0;
  std::shared_ptr<const void> keep;  // the model file mem points into, if any
  OwnKernel own = OwnKernel::none;
  int64_t wblock = 16;                // depthwise: channels per block of the layout
  int64_t cstride = 0, tap_h = 0, tap_w = 0;  // depthwise_nchw_f32: DepthwiseNchwF32's strides
  PointwiseWeights pointwise{};       // pointwise: where its weights are
  std::vector<int32_t> weight_sums;   // pointwise: per output, over the inputs
  memory::desc md() const { return mem.get_desc(); }
};

// Sets packed->own when its layout is what `kernel` reads: depthwise_u8 the
// weight [C, 1, 1, KH, KW] in blocks of 16 or 8 channels, [C/16][KH][KW][16]
// or [C/8][KH][KW][8] (oneDNN's Abcde16a / Abcde8a); pointwise_u8 the layouts
// pointwise_u8_layout accepts.
void find_own_layout(Packed* packed, const ConvSpec& spec, OwnKernel kernel) {
  packed->own = OwnKernel::none;
  if (kernel == OwnKernel::none) return;
  const BlockedLayout l = BlockedLayout::of(packed->md(), false);
  if (kernel == OwnKernel::depthwise_nchw_f32) {  // plain, or channels in one inner block
    const int64_t dims[5] = {spec.OC, 1, 1, spec.KH, spec.KW};
    if (l.data_type == static_cast<uint32_t>(dt::f32) && l.ndims == 5 && std::equal(dims, dims + 5, l.dims) &&
        (l.nblks == 0 || (l.nblks == 1 && l.idxs[0] == 0))) {
      packed->own = kernel;
      packed->wblock = l.nblks == 0 ? 0 : l.blks[0];
      packed->cstride = l.strides[0];
      packed->tap_h = l.strides[3];
      packed->tap_w = l.strides[4];
    }
    return;
  }
  if (l.data_type != static_cast<uint32_t>(dt::s8)) return;
  if (kernel == OwnKernel::window) {  // plain [OC][KH][KW][IC]
    const int64_t dims[4] = {spec.OC, spec.IC, spec.KH, spec.KW};
    const int64_t strides[4] = {spec.KH * spec.KW * spec.IC, 1, spec.KW * spec.IC, spec.IC};
    if (l.ndims == 4 && l.nblks == 0 && std::equal(dims, dims + 4, l.dims) &&
        std::equal(strides, strides + 4, l.strides)) {
      packed->own = kernel;
    }
    return;
  }
  if (kernel == OwnKernel::depthwise || kernel == OwnKernel::depthwise_avx2) {
    const int64_t dims[5] = {spec.OC, 1, 1, spec.KH, spec.KW};
    const int64_t b = l.nblks == 1 ? l.blks[0] : 0;
    if (l.ndims == 5 && std::equal(dims, dims + 5, l.dims) && (b == 16 || b == 8) &&
        l.idxs[0] == 0 && l.strides[0] == spec.KH * spec.KW * b && l.strides[3] == spec.KW * b &&
        l.strides[4] == b) {
      packed->own = kernel;
      packed->wblock = b;
    }
    return;
  }
  const int64_t dims[4] = {spec.OC, spec.IC, 1, 1};
  if (l.ndims == 4 && std::equal(dims, dims + 4, l.dims) &&
      pointwise_u8_layout(spec.OC, spec.IC, l.nblks, l.blks, l.idxs, l.strides, l.size,
                          &packed->pointwise)) {
    packed->own = kernel;
    packed->weight_sums.resize(static_cast<size_t>(spec.OC));
    pointwise_u8_weight_sums(static_cast<const int8_t*>(packed->mem.get_data_handle()),
                             packed->pointwise, spec.IC, spec.OC, packed->weight_sums.data());
  }
}

struct Prim {
  std::shared_ptr<const Packed> weights;  // the layout this primitive was built for
  int64_t N, H, W;
  qpack_layout x_layout, y_layout;
  qpack_activation post_act;  // f32: an activation after the layer's own, a post-op
  float post_min, post_max;
  bool sum;                   // + the destination's values (sum post-op), then sum_act
  qpack_activation sum_act;
  float sum_min, sum_max;
  float sum_scale;            // u8: the destination's parameters on entry
  int32_t sum_zp;
  bool via_nhwc;  // reorder NCHW data to channels-last around the primitive
  bool split;     // int8_split.h's mode: s32 output, epilogue in C++
  int wanted_zps;  // the zero points the runs it serves need (runtime.h's ZeroPoints)
  int zps;        // those the primitive takes: wanted_zps, or all where that was not to be had
  memory wei;     // weights->mem, or a view of its bytes without the zero-point terms
  dnnl::convolution_forward primitive;
  size_t scratch_size;
};

tag layout_tag(qpack_layout l) { return l == QPACK_LAYOUT_NHWC ? tag::nhwc : tag::nchw; }

class OnednnConv final : public ConvKernel {
 public:
  OnednnConv(const ConvSpec& spec, const void* weight)
      : ConvKernel(spec),
        narrow_(spec.int8() && !isa_has_avx512_vnni() &&
                narrow_weights(static_cast<const int8_t*>(weight), spec.weight_count())),
        split_(splits(spec) && !narrow_),
        subsample_(splits(spec) && subsamples(spec)) {
    // Pack for a representative channels-last problem; other shapes reuse the layout.
    const int64_t H = std::max<int64_t>(kPackSize, spec_.dil_h * (spec_.KH - 1) + 1);
    const int64_t W = std::max<int64_t>(kPackSize, spec_.dil_w * (spec_.KW - 1) + 1);
    init([&] {
      packed_ = relayout_from_plain(weight, wanted_md(1, H, W), 1, H, W);
    });
  }

  // Saved packed bytes: used in place when oneDNN wants their layout here for
  // the problem they were packed for, else decoded and re-packed.
  OnednnConv(const ConvSpec& spec, const SavedForm& form)
      : ConvKernel(spec),
        narrow_(spec.int8() && !isa_has_avx512_vnni() &&
                narrow_weights(BlockedLayout::parse(form.layout, form.what), form.packed.data,
                               form.packed.size)),
        split_(splits(spec) && !narrow_),
        subsample_(splits(spec) && subsamples(spec)) {
    const BlockedLayout saved = BlockedLayout::parse(form.layout, form.what);
    const auto dims = wei_dims();
    bool dims_ok = saved.ndims == static_cast<int32_t>(dims.size());
    for (int i = 0; dims_ok && i < saved.ndims; ++i) dims_ok = saved.dims[i] == dims[i];
    const int64_t N = saved.problem[0], H = saved.problem[1], W = saved.problem[2];
    const int64_t min_h = spec_.dil_h * (spec_.KH - 1) + 1, min_w = spec_.dil_w * (spec_.KW - 1) + 1;
    check(dims_ok && saved.size == form.packed.size &&
              saved.data_type == static_cast<uint32_t>(wei_dt()) && N >= 1 && N <= 1024 &&
              H >= std::max<int64_t>(1, min_h - spec_.pad_t - spec_.pad_b) && H <= 16384 &&
              W >= std::max<int64_t>(1, min_w - spec_.pad_l - spec_.pad_r) && W <= 16384 &&
              N * H * W <= (int64_t(1) << 28),
          QPACK_STATUS_FILE_FORMAT, form.what, ": its oneDNN layout ", saved.str(),
          " does not describe this convolution's weight (", form.packed.size,
          " bytes); the file is corrupt (re-freeze and save it again)");
    init([&] {
      memory::desc md = wanted_md(N, H, W);
      BlockedLayout wanted = BlockedLayout::of(md, split_);
      if (!(wanted == saved) && quant_of(spec_, split_) == Quant::static_out) {
        // saved where it ran without zero points (see build): that layout is as good
        const memory::desc md0 = wanted_md(N, H, W, 0);
        if (BlockedLayout::of(md0, split_) == saved) {
          md = md0;
          wanted = saved;
        }
      }
      auto packed = std::make_shared<Packed>();
      packed->N = N;
      packed->H = H;
      packed->W = W;
      if (form.same_build && wanted == saved) {
        packed->mem = memory(md, engine(), const_cast<uint8_t*>(form.packed.data));
        find_own_layout(packed.get(), spec_, own_);
        packed->keep = form.packed.owner;
        packed_ = packed;
        return;
      }
      layout_differs(form, "saved " + saved.str() + ", oneDNN wants " + wanted.str() + " here");
      std::vector<uint8_t> plain(static_cast<size_t>(spec_.weight_count()) * spec_.weight_elem_size());
      decode_blocked(saved, form.packed.data, spec_.weight_elem_size(), plain.data());
      packed_ = relayout_from_plain(plain.data(), md, N, H, W);
    });
  }

  PackedForm packed_form() const override {
    auto packed = std::atomic_load(&packed_);
    BlockedLayout layout = BlockedLayout::of(packed->md(), split_);
    layout.problem[0] = packed->N;
    layout.problem[1] = packed->H;
    layout.problem[2] = packed->W;
    return PackedForm{layout.bytes(), static_cast<const uint8_t*>(packed->mem.get_data_handle()),
                      packed->md().get_size(), packed};
  }

 private:
  // The weight layout oneDNN wants for the channels-last problem N x H x W
  // (its primitive with the zero points `zps`); plain [OC][KH][KW][IC] for
  // pointwise_u8's windows, which lay it out at each run.
  memory::desc wanted_md(int64_t N, int64_t H, int64_t W, int zps = kBothZp) const {
    if (own_ == OwnKernel::window) return memory::desc(wei_dims(), wei_dt(), tag::acdb);
    return make_pd(N, H, W, tag::nhwc, tag::nhwc, memory::desc(wei_dims(), wei_dt(), tag::any),
                   split_, nullptr, zps)
        .weights_desc();
  }

  // place() fills packed_; then bias and scales.
  template <typename Place>
  void init(const Place& place) {
    try {
      apply_num_threads();
      place();
      if (!spec_.bias.empty()) {
        bias_ = memory({{spec_.OC}, dt::f32, tag::a}, engine(), const_cast<float*>(spec_.bias.data()));
      }
    } catch (const dnnl::error& e) {
      fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN could not pack the convolution weight: ", e.what());
    }
    if (spec_.int8()) {
      wei_scales_ = constant_f32(spec_.weight_scales.data(),
                                 static_cast<int64_t>(spec_.weight_scales.size()));
    }
    counters_.built();
  }

 public:

  void unpack_weight(void* out) const override {
    unpack(std::atomic_load(&packed_)->mem, memory(plain_md(), engine(), out),
           spec_.weight_elem_size());
  }

  size_t nbytes_packed() const override {
    auto packed = std::atomic_load(&packed_);
    size_t total = packed->md().get_size();
    std::vector<const Packed*> seen{packed.get()};
    for (const auto& e : prims_.entries()) {  // private copies (see kMaxRelayouts)
      const Packed* w = e->prim.weights.get();
      if (std::find(seen.begin(), seen.end(), w) == seen.end()) {
        seen.push_back(w);
        total += w->md().get_size();
      }
    }
    return total + spec_.bias.size() * sizeof(float) +
           (spec_.int8() ? spec_.weight_scales.size() * sizeof(float) : 0);
  }

  bool fuses_f32(qpack_activation act) const override {
    dnnl::algorithm alg;
    float alpha, beta;
    return act == QPACK_ACT_NONE || (!spec_.int8() && eltwise_of(act, 0.0f, 1.0f, &alg, &alpha, &beta));
  }

  // A residual add as the convolution's sum post-op, channels-last in and out
  // (the primitive writes y in place: no copy around it), activations oneDNN
  // applies as post-ops. Per node in graphs, one Zen 5 thread, conv + add ->
  // conv with sum:
  // - fp32: MobileNetV2's 1x1 projections 24 @56^2 148 -> 133 us, 32 @28^2
  //   46 -> 43, 160 @7^2 79 -> 76; ResNet-18's 1x1 downsamples about even
  //   (78 / 78, 74 / 78); ResNet-18's 3x3 with an identity shortcut, the
  //   add's 25-33 us at 64 @56^2 and 3-10 us deeper become 0-20 us of the
  //   convolution (brgconv with sum), the whole model 1.3-1.6 % faster
  //   (in-process A/B, 14.77 -> 14.58 and 14.72 -> 14.49 ms). On the Zen 4
  //   host the 3x3 64 @56^2 with sum had run slower (958 -> 1000 us).
  // - int8, every kernel size, and pointwise_u8's sum where that kernel runs
  //   (no clamp of its own; relu / clamp after the add): ResNet-50's 1x1
  //   256 @56^2 168 -> 136 us, 512 @28^2 130 -> 120, 1024 @14^2 119 -> 116;
  //   ResNet-18's 3x3 brgconv adds 0-17 us each below the pair's time (five
  //   adds, 1249 -> 1216 us); MobileNetV2's projections even (+-2 us).
  bool fuses_sum(const ConvShape& s) const override {
    dnnl::algorithm alg;
    float alpha, beta;
    auto post_op = [&](qpack_activation act, float lo, float hi) {
      return act == QPACK_ACT_NONE || (!own_activation(act) && eltwise_of(act, lo, hi, &alg, &alpha, &beta));
    };
    if (s.x_layout != QPACK_LAYOUT_NHWC || s.y_layout != QPACK_LAYOUT_NHWC || subsample_ ||
        !post_op(s.post_act, s.post_min, s.post_max) || !post_op(s.sum_act, s.sum_min, s.sum_max)) {
      return false;
    }
    if (!spec_.int8()) return true;
    if (split_) return false;
    if (runs_own(s, *std::atomic_load(&packed_))) {  // pointwise_u8's sum: no clamp of its own, a clamp after
      return own_ == OwnKernel::pointwise && std::isinf(spec_.clamp_min) && std::isinf(spec_.clamp_max) &&
             (s.sum_act == QPACK_ACT_NONE || s.sum_act == QPACK_ACT_RELU || s.sum_act == QPACK_ACT_CLAMP);
    }
    return true;
  }

  // Whether a u8 run of shape s takes qpack's own kernel.
  bool runs_own(const ConvShape& s, const Packed& packed) const {
    return own_ != OwnKernel::none && packed.own == own_ &&
           (own_ != OwnKernel::pointwise || pointwise_u8_faster(spec_.IC, packed.pointwise, s.OH * s.OW));
  }

  bool fast_on_nchw_f32(const ConvShape& s) const override {
    DepthwiseNchwF32 a;
    return planar(s, *std::atomic_load(&packed_), nullptr, nullptr, &a) && depthwise_nchw_f32_faster(a);
  }

 protected:
  void do_run_f32(const ConvShape& s, const float* x, float* y) const override {
    DepthwiseNchwF32 a;
    auto packed = std::atomic_load(&packed_);
    if (s.x_layout == QPACK_LAYOUT_NCHW && s.y_layout == QPACK_LAYOUT_NCHW && planar(s, *packed, x, y, &a) &&
        depthwise_nchw_f32_faster(a)) {
      depthwise_nchw_f32(a, num_threads());
      counters_.hit();
      return;
    }
    execute_conv(s, const_cast<float*>(x), y, nullptr, false);
  }

  void do_run_u8(const ConvShape& s, const uint8_t* x, float input_scale, int32_t input_zero_point,
                 uint8_t* y) const override {
    const RunQuant rq{input_scale, input_zero_point, s.sum ? s.out_scale : spec_.output_scale,
                      s.sum ? s.out_zp : spec_.output_zero_point};
    if (own_ != OwnKernel::none) {
      auto packed = std::atomic_load(&packed_);
      if (runs_own(s, *packed)) {
        run_own(s, *packed, x, rq, y);
        return;
      }
    }
    // No VNNI: a strided 1x1 reads its pixels gathered (every mode), and the
    // input runs fused when the weights or it are narrow, else split.
    ConvShape read = s;
    if (subsample_) {
      x = gather_strided(s, x);
      read.H = s.OH;
      read.W = s.OW;
    }
    if (!split_ || narrow(x, s.N * spec_.IC * read.H * read.W, input_zero_point)) {
      execute_conv(read, const_cast<uint8_t*>(x), y, &rq, false);
      return;
    }
    ConvShape stacked = read;
    stacked.N = 2 * s.N;
    const int64_t in = s.N * spec_.IC * stacked.H * stacked.W, out = s.N * spec_.OC * s.OH * s.OW;
    counters_.ran_split();
    const auto split = split_input(x, in, input_zero_point, out);
    const RunQuant split_rq{1.0f, split.zero_point, 1.0f, 0};
    execute_conv(stacked, split.halves, split.acc, &split_rq, true);
    const Epilogue e{input_scale, spec_.weight_scales.data(), spec_.per_channel(),
                     spec_.bias.empty() ? nullptr : spec_.bias.data(),
                     spec_.clamp_min, spec_.clamp_max, spec_.output_scale,
                     spec_.output_zero_point};
    if (s.y_layout == QPACK_LAYOUT_NHWC) {
      epilogue_u8(split.acc, s.N * s.OH * s.OW, spec_.OC, 1, e, y);
    } else {
      epilogue_u8(split.acc, s.N, spec_.OC, s.OH * s.OW, e, y);
    }
  }

 private:
  static constexpr int64_t kPackSize = 28;

  // depthwise_nchw_f32's arguments for shape s on `packed`: false where it
  // cannot run it (another kernel, a layout it does not read, an activation
  // that is no clamp). The layer's clamp and the run's activation become one
  // clamp [lo, hi].
  bool planar(const ConvShape& s, const Packed& packed, const float* x, float* y, DepthwiseNchwF32* a) const {
    if (own_ != OwnKernel::depthwise_nchw_f32 || packed.own != own_) return false;
    float lo = spec_.clamp_min, hi = spec_.clamp_max;
    switch (s.post_act) {
      case QPACK_ACT_NONE: break;
      case QPACK_ACT_RELU: lo = std::max(lo, 0.0f); hi = std::max(hi, 0.0f); break;
      case QPACK_ACT_CLAMP:
        lo = std::min(std::max(lo, s.post_min), s.post_max);
        hi = std::max(std::min(hi, s.post_max), s.post_min);
        break;
      default: return false;
    }
    *a = DepthwiseNchwF32{x, y, s.N, spec_.OC, s.H, s.W, s.OH, s.OW, spec_.KH, spec_.KW, spec_.stride_h,
                          spec_.stride_w, spec_.pad_t, spec_.pad_l, spec_.dil_h, spec_.dil_w,
                          static_cast<const float*>(packed.mem.get_data_handle()), packed.wblock,
                          packed.cstride, packed.tap_h, packed.tap_w,
                          spec_.bias.empty() ? nullptr : spec_.bias.data(), lo, hi};
    return true;
  }
  // f32 SiLU and sigmoid after the convolution: qpack's vector loop over the
  // output (vec_math.h), not oneDNN 3.2's eltwise post-op, which spends twice
  // its time on them (Zen 4, 1 thread, 1.2M values: swish 40 us per 64K
  // values against 19). GELU stays a post-op: oneDNN's erf is the faster.
  static bool own_activation(qpack_activation act) {
    return (act == QPACK_ACT_SILU || act == QPACK_ACT_SIGMOID) && activate_f32_vectorized(act);
  }
  static constexpr int64_t kActivationGrain = 16384;
  static constexpr size_t kMaxPrims = 16;
  // A shape whose best kernel wants another weight layout re-packs the shared
  // weights (copy-on-write) at most this many times; after that such shapes
  // get a private copy, so alternating shapes cannot thrash.
  static constexpr int kMaxRelayouts = 2;

  std::shared_ptr<const Packed> relayout_from_plain(const void* weight, const memory::desc& md,
                                                    int64_t N, int64_t H, int64_t W) const {
    auto packed = std::make_shared<Packed>();
    packed->N = N;
    packed->H = H;
    packed->W = W;
    packed->mem = memory(md, engine());
    reorder(memory(plain_md(), engine(), const_cast<void*>(weight)), packed->mem);
    find_own_layout(packed.get(), spec_, own_);
    return packed;
  }

  // New layout from the packed form (never from the released original).
  std::shared_ptr<const Packed> relayout(const memory::desc& md, const ConvShape& s) const {
    std::vector<uint8_t> plain(plain_md().get_size());
    unpack_weight(plain.data());
    return relayout_from_plain(plain.data(), md, s.N, s.H, s.W);
  }

  // int8 without VNNI runs split unless its weights are narrow (int8_split.h);
  // depthwise int8 kernels widen to 32 bits: exact without VNNI.
  static bool splits(const ConvSpec& spec) {
    return spec.int8() && !spec.depthwise() && !isa_has_vnni();
  }

  // A 1x1 convolution that skips pixels and pads none (see the top of the file).
  static bool subsamples(const ConvSpec& spec) {
    return spec.KH == 1 && spec.KW == 1 && (spec.stride_h > 1 || spec.stride_w > 1) &&
           spec.pad_t == 0 && spec.pad_l == 0 && spec.pad_b == 0 && spec.pad_r == 0;
  }

  // The pixels a subsampling convolution reads, [N][OH][OW] in x's layout, in a
  // per-thread buffer (valid until the thread's next gather).
  const uint8_t* gather_strided(const ConvShape& s, const uint8_t* x) const {
    const int64_t C = spec_.IC, sh = spec_.stride_h, sw = spec_.stride_w;
    auto* out = static_cast<uint8_t*>(
        thread_buffer(ThreadBuffer::subsample, static_cast<size_t>(s.N * C * s.OH * s.OW)));
    if (s.x_layout == QPACK_LAYOUT_NHWC) {
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t oh = 0; oh < s.OH; ++oh) {
          const uint8_t* row = x + ((n * s.H + oh * sh) * s.W) * C;
          uint8_t* dst = out + ((n * s.OH + oh) * s.OW) * C;
          for (int64_t ow = 0; ow < s.OW; ++ow) std::memcpy(dst + ow * C, row + ow * sw * C, C);
        }
    } else {
      for (int64_t nc = 0; nc < s.N * C; ++nc)
        for (int64_t oh = 0; oh < s.OH; ++oh) {
          const uint8_t* row = x + (nc * s.H + oh * sh) * s.W;
          uint8_t* dst = out + (nc * s.OH + oh) * s.OW;
          for (int64_t ow = 0; ow < s.OW; ++ow) dst[ow] = row[ow * sw];
        }
    }
    return out;
  }

  dt wei_dt() const { return spec_.int8() ? dt::s8 : dt::f32; }
  dt act_dt() const { return spec_.int8() ? dt::u8 : dt::f32; }
  // split: int8_split.h's mode (s32 output, no bias: the epilogue adds it)
  dt dst_dt(bool split) const { return split ? dt::s32 : act_dt(); }
  bool with_bias(bool split) const { return !spec_.bias.empty() && !split; }
  bool grouped() const { return spec_.groups > 1; }

  memory::dims wei_dims() const {
    if (grouped()) return {spec_.groups, spec_.ocg(), spec_.icg(), spec_.KH, spec_.KW};
    return {spec_.OC, spec_.IC, spec_.KH, spec_.KW};
  }
  memory::desc plain_md() const {
    return memory::desc(wei_dims(), wei_dt(), grouped() ? tag::goihw : tag::oihw);
  }

  // run: the shape's activation after the layer's own, as one more post-op (f32)
  dnnl::convolution_forward::primitive_desc make_pd(int64_t N, int64_t H, int64_t W, tag x_tag,
                                                    tag y_tag, const memory::desc& wei_md, bool split,
                                                    const ConvShape* run = nullptr,
                                                    int zps = kBothZp) const {
    // A subsampling convolution's problems are the gathered pixels, stride 1.
    int64_t OH = H, OW = W;
    if (!subsample_) spec_.output_size(H, W, &OH, &OW);
    auto attr = make_attr(quant_of(spec_, split), spec_.per_channel() ? (grouped() ? 3 : 1) : 0,
                          spec_.clamp_min, spec_.clamp_max, zps);
    dnnl::algorithm post;
    float alpha, beta;
    if (run != nullptr && !own_activation(run->post_act) &&
        eltwise_of(run->post_act, run->post_min, run->post_max, &post, &alpha, &beta)) {
      dnnl::post_ops po = attr.get_post_ops();
      po.append_eltwise(post, alpha, beta);
      attr.set_post_ops(po);
    }
    if (run != nullptr && run->sum) {  // fuses_sum checked the activations
      dnnl::post_ops po = attr.get_post_ops();
      if (spec_.int8()) {
        po.append_sum(run->sum_scale, run->sum_zp);
      } else {
        po.append_sum(1.0f);
      }
      if (eltwise_of(run->sum_act, run->sum_min, run->sum_max, &post, &alpha, &beta)) {
        po.append_eltwise(post, alpha, beta);
      }
      attr.set_post_ops(po);
    }
    memory::desc src_md({N, spec_.IC, H, W}, act_dt(), x_tag);
    memory::desc dst_md({N, spec_.OC, OH, OW}, dst_dt(split), y_tag);
    const memory::dims strides{subsample_ ? 1 : spec_.stride_h, subsample_ ? 1 : spec_.stride_w};
    const memory::dims dilates{spec_.dil_h - 1, spec_.dil_w - 1};
    const memory::dims pad_l{spec_.pad_t, spec_.pad_l}, pad_r{spec_.pad_b, spec_.pad_r};
    const auto pk = dnnl::prop_kind::forward_inference;
    const auto alg = dnnl::algorithm::convolution_direct;
    if (!with_bias(split)) {
      return dnnl::convolution_forward::primitive_desc(engine(), pk, alg, src_md, wei_md, dst_md,
                                                       strides, dilates, pad_l, pad_r, attr);
    }
    memory::desc bia_md({spec_.OC}, dt::f32, tag::a);
    return dnnl::convolution_forward::primitive_desc(engine(), pk, alg, src_md, wei_md, bia_md,
                                                     dst_md, strides, dilates, pad_l, pad_r, attr);
  }

  // Every primitive is the one oneDNN picks when free to choose the weight
  // layout (format_tag::any). Forcing the packed layout instead lets oneDNN
  // fall back to its reference kernel (100x slower) or, for int8, to a
  // non-VNNI kernel that expects weights packed differently (wrong results).
  // When the best kernel for a shape wants another layout, the weights are
  // re-packed from the packed form. Called under the cache's lock; sets
  // *relaid when it publishes a new packed_ (older primitives are then dropped).
  // A static int8 run whose zero points are 0 gets a primitive without them
  // (runtime.h's ZeroPoints), on the same packed bytes where its blocking is
  // theirs, else on re-packed ones as any shape that wants another layout.
  Prim build(const ConvShape& s, bool split, int zps, bool* relaid, int wanted_zps = -1) const {
    if (wanted_zps < 0) wanted_zps = zps;
    try {
      auto packed = std::atomic_load(&packed_);
      const memory::desc any(wei_dims(), wei_dt(), tag::any);
      const bool plain_nchw = s.x_layout == QPACK_LAYOUT_NCHW || s.y_layout == QPACK_LAYOUT_NCHW;
      // the packed weights for primitive `pd`: themselves, a view, or none
      auto weights_for = [&](const dnnl::convolution_forward::primitive_desc& pd, memory* wei) {
        if (pd.weights_desc() == packed->md()) {
          *wei = packed->mem;
          return true;
        }
        if (zps == kBothZp || !same_blocking(pd.weights_desc(), packed->md())) return false;
        *wei = memory(pd.weights_desc(), engine(), packed->mem.get_data_handle());
        return true;
      };
      auto prim = [&](const dnnl::convolution_forward::primitive_desc& pd, bool via_nhwc, memory wei) {
        return Prim{packed, s.N, s.H, s.W, s.x_layout, s.y_layout, s.post_act, s.post_min, s.post_max,
                    s.sum, s.sum_act, s.sum_min, s.sum_max, s.sum_scale, s.sum_zp, via_nhwc, split,
                    wanted_zps, zps, wei, dnnl::convolution_forward(pd), pd.scratchpad_desc().get_size()};
      };
      memory wei;
      if (plain_nchw) {
        try {
          auto best = make_pd(s.N, s.H, s.W, layout_tag(s.x_layout), layout_tag(s.y_layout), any, split, &s, zps);
          if (!is_reference(best) && weights_for(best, &wei)) return prim(best, false, wei);
        } catch (const dnnl::error&) {
          // fall through to the channels-last primitive
        }
      }
      auto best = make_pd(s.N, s.H, s.W, tag::nhwc, tag::nhwc, any, split, &s, zps);
      if (weights_for(best, &wei)) return prim(best, plain_nchw, wei);
      // Without zero points the best kernel may want another blocking than the
      // packed one (ResNet-18's 512->512 3x3 @7x7: AcdB64a4b, packed AcdB32a4b
      // with zero-point terms; 670 -> 480 us on one Zen 4 thread): re-pack
      // while re-packs remain, else take the primitive with both on the packed bytes.
      if (zps != kBothZp && relayouts_ >= kMaxRelayouts) return build(s, split, kBothZp, relaid, wanted_zps);
      if (!(best.weights_desc() == packed->md())) {
        // Re-pack (copy-on-write) or, past kMaxRelayouts, keep a private copy.
        auto moved = relayout(best.weights_desc(), s);
        if (relayouts_ < kMaxRelayouts) {
          ++relayouts_;
          std::atomic_store(&packed_, moved);
          *relaid = true;
        }
        counters_.built();
        packed = moved;
      }
      return prim(best, plain_nchw, packed->mem);
    } catch (const dnnl::error& e) {
      fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN has no convolution for input ", s.N, "x",
           spec_.IC, "x", s.H, "x", s.W, " with the packed weight layout: ", e.what());
    }
  }

  void execute_conv(const ConvShape& s, void* src, void* dst, const RunQuant* rq, bool split) const {
    bool relaid = false;
    const int zps = needed_zero_points(quant_of(spec_, split), rq);
    const auto held = prims_.get(
        [&s, split, zps](const Prim& p) {
          return p.split == split && p.N == s.N && p.H == s.H && p.W == s.W && p.x_layout == s.x_layout &&
                 p.y_layout == s.y_layout && p.post_act == s.post_act && p.post_min == s.post_min &&
                 p.post_max == s.post_max && p.sum == s.sum && p.sum_act == s.sum_act &&
                 p.sum_min == s.sum_min && p.sum_max == s.sum_max && p.sum_scale == s.sum_scale &&
                 p.sum_zp == s.sum_zp && p.wanted_zps == zps;
        },
        [&] { return build(s, split, zps, &relaid); },
        // Primitives built on a replaced layout are rebuilt on demand, so the
        // old copy is freed once in-flight runs end.
        [&relaid](const Prim& old, const Prim& fresh) {
          return !relaid || old.weights == fresh.weights;
        });
    const Prim& prim = held->prim;
    const memory::dims src_dims{s.N, spec_.IC, s.H, s.W}, dst_dims{s.N, spec_.OC, s.OH, s.OW};
    memory src_user({src_dims, act_dt(), layout_tag(s.x_layout)}, engine(), src);
    memory dst_user({dst_dims, dst_dt(split), layout_tag(s.y_layout)}, engine(), dst);
    memory src_m = src_user, dst_m = dst_user;
    // Channels-last copies (via_nhwc only) in per-thread buffers.
    const bool copy_src = prim.via_nhwc && s.x_layout == QPACK_LAYOUT_NCHW;
    const bool copy_dst = prim.via_nhwc && s.y_layout == QPACK_LAYOUT_NCHW;
    if (copy_src) {
      memory::desc md(src_dims, act_dt(), tag::nhwc);
      src_m = memory(md, engine(), thread_buffer(ThreadBuffer::nhwc_src, md.get_size()));
      reorder(src_user, src_m);
    }
    if (copy_dst) {
      memory::desc md(dst_dims, dst_dt(split), tag::nhwc);
      dst_m = memory(md, engine(), thread_buffer(ThreadBuffer::nhwc_dst, md.get_size()));
    }
    ExecArgs args;
    args.add(DNNL_ARG_SRC, src_m);
    args.add(DNNL_ARG_WEIGHTS, prim.wei);
    args.add(DNNL_ARG_DST, dst_m);
    if (with_bias(split)) args.add(DNNL_ARG_BIAS, bias_);
    if (rq != nullptr) add_quant_args(args, quant_of(spec_, split), *rq, wei_scales_, prim.zps);
    execute(prim.primitive, args, prim.scratch_size, "convolution");
    if (own_activation(s.post_act)) {
      auto* y = static_cast<float*>(dst_m.get_data_handle());
      parallel_chunks(s.N * spec_.OC * s.OH * s.OW, kActivationGrain, num_threads(),
                      [&](int, int64_t b, int64_t e) { activate_f32_vector(s.post_act, y + b, y + b, e - b); });
    }
    if (copy_dst) reorder(dst_m, dst_user);
  }

  // qpack's own kernel; NCHW data is reordered to channels-last around it
  // (in per-thread buffers), as around a channels-last primitive.
  void run_own(const ConvShape& s, const Packed& packed, const uint8_t* x, const RunQuant& rq,
               uint8_t* y) const {
    const memory::dims src_dims{s.N, spec_.IC, s.H, s.W}, dst_dims{s.N, spec_.OC, s.OH, s.OW};
    const uint8_t* src = x;
    uint8_t* dst = y;
    if (s.x_layout == QPACK_LAYOUT_NCHW) {
      memory::desc md(src_dims, dt::u8, tag::nhwc);
      memory nhwc(md, engine(), thread_buffer(ThreadBuffer::nhwc_src, md.get_size()));
      reorder(memory({src_dims, dt::u8, tag::nchw}, engine(), const_cast<uint8_t*>(x)), nhwc);
      src = static_cast<const uint8_t*>(nhwc.get_data_handle());
    }
    if (s.y_layout == QPACK_LAYOUT_NCHW) {
      const size_t size = memory::desc(dst_dims, dt::u8, tag::nhwc).get_size();
      dst = static_cast<uint8_t*>(thread_buffer(ThreadBuffer::nhwc_dst, size));
    }
    const auto* w = static_cast<const int8_t*>(packed.mem.get_data_handle());
    const RequantU8 q{rq.src_scale, rq.src_zp, spec_.weight_scales.data(), spec_.per_channel(),
                      spec_.bias.empty() ? nullptr : spec_.bias.data(), spec_.clamp_min,
                      spec_.clamp_max, rq.dst_scale, rq.dst_zp};
    if (own_ == OwnKernel::window) {
      const WindowU8 window{spec_.IC, spec_.KH, spec_.KW, spec_.pad_t, spec_.pad_l};
      PointwiseU8 a{src, dst, s.N, s.H, s.W, spec_.KH * spec_.KW * spec_.IC, spec_.OC, s.OH, s.OW,
                    spec_.stride_h, spec_.stride_w, w, PointwiseWeights{}, nullptr, q};
      a.window = &window;
      pointwise_u8(a, num_threads());
    } else if (own_ != OwnKernel::pointwise) {
      depthwise_u8(DepthwiseU8{src, dst, s.N, s.H, s.W, spec_.OC, s.OH, s.OW, spec_.KH, spec_.KW,
                               spec_.stride_h, spec_.stride_w, spec_.pad_t, spec_.pad_l,
                               spec_.dil_h, spec_.dil_w, w, packed.wblock, q},
                   num_threads(),
                   own_ == OwnKernel::depthwise ? DepthwiseIsa::avx512_vnni : DepthwiseIsa::avx2);
    } else {
      PointwiseU8 a{src, dst, s.N, s.H, s.W, spec_.IC, spec_.OC, s.OH, s.OW,
                    spec_.stride_h, spec_.stride_w, w, packed.pointwise,
                    packed.weight_sums.data(), q};
      if (s.sum) {  // fuses_sum: NHWC in and out, so dst is y
        a.sum = true;
        a.residual_mult = s.sum_scale / s.out_scale;
        a.residual_offset = -static_cast<float>(s.sum_zp) * a.residual_mult;
        const bool relu = s.sum_act == QPACK_ACT_RELU, clamp = s.sum_act == QPACK_ACT_CLAMP;
        output_bounds_u8(relu ? 0.0f : clamp ? s.sum_min : -std::numeric_limits<float>::infinity(),
                         clamp ? s.sum_max : std::numeric_limits<float>::infinity(), s.out_scale, s.out_zp,
                         &a.sum_qmin, &a.sum_qmax);
      }
      pointwise_u8(a, num_threads());
    }
    if (dst != y) {
      reorder(memory({dst_dims, dt::u8, tag::nhwc}, engine(), dst),
              memory({dst_dims, dt::u8, tag::nchw}, engine(), y));
    }
    counters_.hit();
  }

  // int8 weights all within [-64, 64] (int8_split.h); only looked at where it
  // matters, without AVX-512 VNNI (a pass over every weight, every mapped page)
  const bool narrow_;
  const bool split_;  // int8 without VNNI and wide weights: wide inputs run split (int8_split.h)
  const bool subsample_;  // int8 without VNNI, a strided 1x1: gather the pixels read, run stride 1
  const OwnKernel own_ = own_kernel_for(spec_, narrow_);  // static int8 on qpack's kernel, where it fits
  mutable std::shared_ptr<const Packed> packed_;  // atomic_load/store only
  mutable int relayouts_ = 0;                     // guarded by the cache's lock
  memory bias_;
  memory wei_scales_;  // over spec_.weight_scales (int8)
  PrimCache<Prim> prims_{counters_, kMaxPrims};
};

}  // namespace

std::unique_ptr<ConvKernel> make_conv(const ConvSpec& spec, const void* weight) {
  return std::make_unique<OnednnConv>(spec, weight);
}

std::unique_ptr<ConvKernel> load_conv(const ConvSpec& spec, const SavedForm& form) {
  return std::make_unique<OnednnConv>(spec, form);
}

}  // namespace onednn_rt
}  // namespace qpack
