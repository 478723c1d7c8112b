// oneDNN linear on the matmul primitive: fp32, static int8 (u8 x s8 -> u8)
// and dynamic int8 (f32 quantized per call, u8 x s8 -> f32).
//
// The weight [N, K] is the matmul's B = [K, N] in layout "ba". It is reordered
// once into the layout the primitive asks for (format_tag::any, queried) and
// reordered back for unpack, which is exact (same data type, no scaling).
// Primitives are created per batch size M against that fixed packed layout
// (runtime.h's PrimCache); runs take no lock and use a per-thread user-mode
// scratchpad.
//
// On ISAs without VNNI the int8 modes run split (int8_split.h): one u8 x s8
// -> s32 primitive over the two halves of the input stacked as 2M rows, and
// the epilogue in C++. The packed layout is queried with those attributes.
// Narrow inputs (every byte and the zero point below 128) run the fused
// primitive there too, on the same packed weight: exact, at half the work;
// narrow weights (all within [-64, 64]) always do, and batches of up to
// kGemvMaxRows (16) rows of them run on qpack's own kernel (gemv_u8.h) with
// the split runs' epilogue; with AVX-512 VNNI, batches of up to
// kGemvVnniMaxRows (8) rows run on gemv_vnni.h, on oneDNN's packed layout.
// fp32 weights packed "ba" for oneDNN's gemm (AVX2)
// run batches of up to kGemmF32MaxRows (64) rows on gemm_f32.h.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/onednn/gemm_f32.h"
#include "backends/onednn/gemv_f32.h"
#include "backends/onednn/gemv_u8.h"
#include "backends/onednn/gemv_vnni.h"
#include "backends/onednn/int8_split.h"
#include "backends/onednn/own_u8.h"
#include "backends/onednn/runtime.h"
#include "core/error.h"
#include "core/linear.h"
#include "core/quant.h"

namespace qpack {
namespace onednn_rt {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// An eltwise post-op after the matmul (f32 graphs: GELU after a Linear).
struct PostAct {
  qpack_activation act = QPACK_ACT_NONE;
  float lo = 0, hi = 0;
  bool operator==(const PostAct& o) const { return act == o.act && lo == o.lo && hi == o.hi; }
};

struct Prim {
  int64_t M;
  PostAct post;
  bool split;       // int8_split.h's mode
  int wanted_zps;   // the zero points the runs it serves need (runtime.h's ZeroPoints)
  int zps;          // those the primitive takes: wanted_zps, or both
  dnnl::memory wei;  // the packed weight, or a view of its bytes
  dnnl::matmul primitive;
  size_t scratch_size;
};

class OnednnLinear final : public LinearKernel {
 public:
  OnednnLinear(const LinearSpec& spec, const void* weight)
      : LinearKernel(spec),
        split_(spec.int8() && !isa_has_vnni() &&
               !narrow_weights(static_cast<const int8_t*>(weight), spec.K * spec.N)) {
    init([&](const memory::desc& md) {
      packed_ = memory(md, engine());
      reorder(plain(const_cast<void*>(weight)), packed_);
    });
  }

  // Saved packed bytes: used in place when they are in the layout oneDNN
  // wants here, else decoded from the saved layout and re-packed.
  OnednnLinear(const LinearSpec& spec, const SavedForm& form)
      : LinearKernel(spec),
        split_(spec.int8() && !isa_has_vnni() &&
               !narrow_weights(BlockedLayout::parse(form.layout, form.what), form.packed.data,
                               form.packed.size)) {
    const BlockedLayout saved = BlockedLayout::parse(form.layout, form.what);
    const size_t elem = spec_.weight_elem_size();
    check(saved.ndims == 2 && saved.dims[0] == spec_.K && saved.dims[1] == spec_.N &&
              saved.size == form.packed.size &&
              saved.data_type == static_cast<uint32_t>(wei_dt()),
          QPACK_STATUS_FILE_FORMAT, form.what, ": its oneDNN layout ", saved.str(),
          " does not describe a [", spec_.K, ", ", spec_.N, "] weight of ", form.packed.size,
          " bytes; the file is corrupt (re-freeze and save it again)");
    init([&](const memory::desc& md) {
      const BlockedLayout wanted = BlockedLayout::of(md, split_);
      if (form.same_build && wanted == saved) {
        packed_ = memory(md, engine(), const_cast<uint8_t*>(form.packed.data));
        keep_ = form.packed.owner;
        return;
      }
      layout_differs(form, "saved " + saved.str() + ", oneDNN wants " + wanted.str() + " here");
      // Decoded as [K, N] row-major, which is the matmul's B: reorder from "ab".
      std::vector<uint8_t> kn(static_cast<size_t>(spec_.K * spec_.N) * elem);
      decode_blocked(saved, form.packed.data, elem, kn.data());
      packed_ = memory(md, engine());
      reorder(memory({{spec_.K, spec_.N}, wei_dt(), tag::ab}, engine(), kn.data()), packed_);
    });
  }

  void unpack_weight(void* out) const override {
    unpack(packed_, plain(out), spec_.weight_elem_size());
  }

  PackedForm packed_form() const override {
    const auto md = packed_.get_desc();
    BlockedLayout layout = BlockedLayout::of(md, split_);
    layout.problem[0] = kPackBatch;
    return PackedForm{layout.bytes(),
                      static_cast<const uint8_t*>(packed_.get_data_handle()), md.get_size(),
                      keep_};
  }

  size_t nbytes_packed() const override {
    return packed_.get_desc().get_size() + spec_.bias.size() * sizeof(float) +
           (spec_.int8() ? spec_.weight_scales.size() * sizeof(float) : 0);
  }

 protected:
  // Whether an f32 run of M rows takes qpack's own kernels (gemv_f32, gemm_f32), not the matmul.
  bool runs_own_f32(int64_t M) const {
    return (f32_nstride_ > 0 && M <= kGemvF32MaxRows) || (own_f32_ && gemm_f32_fits(M, spec_.K));
  }

  void do_run_f32(int64_t M, const float* x, float* y) const override {
    if (spec_.mode == QPACK_MODE_F32) {
      if (f32_nstride_ > 0 && M <= kGemvF32MaxRows) {
        gemv_f32(GemvF32{x, M, spec_.K, spec_.N, static_cast<const float*>(packed_.get_data_handle()),
                         f32_nstride_, f32_kstride_, spec_.bias.empty() ? nullptr : spec_.bias.data(),
                         spec_.clamp_min, spec_.clamp_max, y},
                 num_threads());
        count_own_run();
        return;
      }
      if (own_f32_ && gemm_f32_fits(M, spec_.K)) {
        gemm_f32(GemmF32{x, M, spec_.K, spec_.N, static_cast<const float*>(packed_.get_data_handle()),
                         spec_.bias.empty() ? nullptr : spec_.bias.data(), spec_.clamp_min,
                         spec_.clamp_max, y},
                 num_threads());
        count_own_run();
        return;
      }
      execute_matmul(M, const_cast<float*>(x), y, nullptr, false);
      return;
    }
    // Dynamic: choose the input's parameters as PyTorch does, quantize, run u8 x s8 -> f32.
    const DynamicInput in = quantize_dynamic(x, M * spec_.K);
    run_int8(M, in.data, RunQuant{in.q.scale, in.q.zero_point, 1.0f, 0}, y);
  }

  // The activation as oneDNN's eltwise post-op of the matmul, where the matmul
  // runs (not the few rows qpack's own kernels take): GELU, Hardswish and
  // LeakyReLU, which keep NaN there. SiLU and sigmoid stay with the caller's
  // vector loop (twice as fast on Zen 4, conv.cc), and so do ReLU, clamps and
  // Hardsigmoid (oneDNN's turn NaN into a number; the caller's loop is cheap).
  bool do_run_f32_fused(int64_t M, const float* x, float* y, qpack_activation act, float lo,
                        float hi) const override {
    if (runs_own_f32(M) ||
        !(act == QPACK_ACT_GELU || act == QPACK_ACT_HARDSWISH || act == QPACK_ACT_LEAKY_RELU)) {
      return false;
    }
    execute_matmul(M, const_cast<float*>(x), y, nullptr, false, PostAct{act, lo, hi});
    return true;
  }

  void do_run_u8(int64_t M, const uint8_t* x, float input_scale, int32_t input_zero_point,
                 uint8_t* y) const override {
    run_int8(M, x,
             RunQuant{input_scale, input_zero_point, spec_.output_scale, spec_.output_zero_point},
             y);
  }

 private:
  static constexpr int64_t kPackBatch = 64;

  // The layout oneDNN wants for a representative batch (other batch sizes
  // reuse it); place(md) fills packed_ in it. Then bias and scales.
  template <typename Place>
  void init(const Place& place) {
    try {
      apply_num_threads();
      auto pd = make_pd(kPackBatch, memory::desc({spec_.K, spec_.N}, wei_dt(), tag::any), split_);
      place(gemm_layout(pd.weights_desc()));
      if (!spec_.bias.empty()) {
        bias_ = memory({{1, spec_.N}, dt::f32, tag::ab}, engine(),
                       const_cast<float*>(spec_.bias.data()));
      }
    } catch (const dnnl::error& e) {
      fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN could not pack the weight: ", e.what());
    }
    if (spec_.int8()) {
      wei_scales_ = constant_f32(spec_.weight_scales.data(),
                                 static_cast<int64_t>(spec_.weight_scales.size()));
    }
    // Few rows on qpack's own kernels (QPACK_ONEDNN_OWN_GEMM=0 when the linear
    // is made keeps them on oneDNN's): fp32 packed "ba" (oneDNN's gemm: AVX2)
    // on gemm_f32.h, int8 narrow weights without VNNI packed "ba" on gemv_u8.h.
    const bool own_gemm = own_enabled("QPACK_ONEDNN_OWN_GEMM");
    const bool own = isa_has_avx2() && own_avx2_available() && own_gemm;
    own_f32_ = own && spec_.mode == QPACK_MODE_F32 &&
               packed_.get_desc() == memory::desc({spec_.K, spec_.N}, dt::f32, tag::ba);
    const memory::desc ba({spec_.K, spec_.N}, dt::s8, tag::ba);
    if (own && spec_.int8() && !split_ && !isa_has_vnni() && packed_.get_desc() == ba) {
      weight_sums_.resize(static_cast<size_t>(spec_.N));
      gemv_u8_weight_sums(static_cast<const int8_t*>(packed_.get_data_handle()), spec_.N, spec_.K,
                          weight_sums_.data());
    }
    // Packed for oneDNN's brgemm (AVX-512): few rows of fp32 on gemv_f32.h, of
    // int8 with VNNI on gemv_vnni.h (their strides stay 0 where they do not run)
    const BlockedLayout layout = BlockedLayout::of(packed_.get_desc(), false);
    if (own_gemm && spec_.mode == QPACK_MODE_F32) {
      gemv_f32_layout(layout, spec_.K, spec_.N, &f32_nstride_, &f32_kstride_);
    }
    if (own_gemm && spec_.int8() && isa_has_avx512_vnni() &&
        gemv_vnni_layout(layout, spec_.K, spec_.N, &vnni_nstride_, &vnni_kstride_)) {
      weight_sums_.resize(static_cast<size_t>(spec_.N));
      gemv_vnni_weight_sums(vnni(nullptr, 0, 0, nullptr), weight_sums_.data());
    }
    counters_.built();
  }
  static constexpr size_t kMaxPrims = 16;

  dt wei_dt() const { return spec_.int8() ? dt::s8 : dt::f32; }
  dt src_dt() const { return spec_.int8() ? dt::u8 : dt::f32; }
  // split: int8_split.h's mode (s32 output, no bias: the epilogue adds it)
  dt dst_dt(bool split) const {
    if (split) return dt::s32;
    return spec_.static_int8() ? dt::u8 : dt::f32;
  }
  bool with_bias(bool split) const { return !spec_.bias.empty() && !split; }
  memory plain(void* data) const {
    return memory({{spec_.K, spec_.N}, wei_dt(), tag::ba}, engine(), data);
  }

  // Where the matmul is oneDNN's gemm (the layout it asks for is plain
  // [K, N], "ab": AVX2 with oneDNN 3.2) the weight is packed transposed, "ba"
  // (the original [N, K] order), when the same implementation takes it in
  // every mode the op runs: its jit gemm runs transposed B faster (Zen 3, 1
  // thread: fp32 256x4096x1024 52.8 -> 34.1 ms, 32x1024x4096 7.6 -> 5.6 ms;
  // int8 32x1024x4096 3302 -> 2145 us; 1x512x512 the same). A blocked layout
  // (brgemm: AVX-512) is kept.
  memory::desc gemm_layout(const memory::desc& wanted) const {
    const memory::desc ab({spec_.K, spec_.N}, wei_dt(), tag::ab);
    if (!(wanted == ab)) return wanted;
    try {
      const memory::desc ba({spec_.K, spec_.N}, wei_dt(), tag::ba);
      for (bool split : {false, split_}) {
        auto pd = make_pd(kPackBatch, ba, split);
        if (is_reference(pd) || std::string(pd.impl_info_str()).find("gemm") == std::string::npos) {
          return wanted;
        }
      }
      return ba;
    } catch (const dnnl::error&) {
    }
    return wanted;
  }

  // zps: the zero points of a static run that are not 0 (runtime.h's
  // ZeroPoints): without them oneDNN's int8 gemm skips its per-call
  // compensation (Zen 3, 1x512x512: 64 -> 33 us).
  dnnl::matmul::primitive_desc make_pd(int64_t M, const memory::desc& wei_md, bool split,
                                       int zps = kBothZp, const PostAct& post = {}) const {
    auto attr = make_attr(quant_of(spec_, split), spec_.per_channel() ? (1 << 1) : 0,
                          spec_.clamp_min, spec_.clamp_max, zps);
    dnnl::algorithm alg;
    float alpha, beta;
    if (post.act != QPACK_ACT_NONE && eltwise_of(post.act, post.lo, post.hi, &alg, &alpha, &beta)) {
      dnnl::post_ops po = attr.get_post_ops();
      po.append_eltwise(alg, alpha, beta);
      attr.set_post_ops(po);
    }
    memory::desc src_md({M, spec_.K}, src_dt(), tag::ab);
    memory::desc dst_md({M, spec_.N}, dst_dt(split), tag::ab);
    if (!with_bias(split)) return dnnl::matmul::primitive_desc(engine(), src_md, wei_md, dst_md, attr);
    memory::desc bia_md({1, spec_.N}, dt::f32, tag::ab);
    return dnnl::matmul::primitive_desc(engine(), src_md, wei_md, bia_md, dst_md, attr);
  }

  // A primitive without the zero points that are 0 where it takes the packed
  // weight as it is (or its bytes, without the compensation terms), else with both.
  Prim build(int64_t M, bool split, int zps, const PostAct& post) const {
    try {
      if (zps != kBothZp) {
        try {
          const memory::desc packed = packed_.get_desc();
          const bool plain = packed.get_size() == static_cast<size_t>(spec_.K * spec_.N) * spec_.weight_elem_size();
          auto pd = make_pd(M, plain ? packed : memory::desc({spec_.K, spec_.N}, wei_dt(), tag::any), split, zps,
                            post);
          const memory::desc md = pd.weights_desc();
          if (!is_reference(pd) && (md == packed || same_blocking(md, packed))) {
            return Prim{M, post, split, zps, zps, memory(md, engine(), packed_.get_data_handle()),
                        dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
          }
        } catch (const dnnl::error&) {
          // the primitive with both zero points below
        }
      }
      auto pd = make_pd(M, packed_.get_desc(), split, kBothZp, post);
      return Prim{M, post, split, zps, kBothZp, packed_, dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
    } catch (const dnnl::error& e) {
      fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN has no matmul for batch ", M,
           " with the packed weight layout: ", e.what());
    }
  }

  // Static (u8 out) or dynamic (f32 out) int8 on a u8 input.
  void run_int8(int64_t M, const uint8_t* x, const RunQuant& rq, void* y) const {
    if (!weight_sums_.empty() && M <= (vnni_nstride_ > 0 ? kGemvVnniMaxRows : kGemvMaxRows)) {
      // the epilogue's [2][M][N] halves (2 hi + lo): hi 0, lo the sums
      const size_t n = static_cast<size_t>(M * spec_.N);
      auto* acc = static_cast<int32_t*>(thread_buffer(ThreadBuffer::split, 2 * n * sizeof(int32_t)));
      std::memset(acc, 0, n * sizeof(int32_t));
      if (vnni_nstride_ > 0) {
        gemv_vnni(vnni(x, M, rq.src_zp, acc + n), num_threads());
      } else {
        gemv_u8(GemvU8{x, M, spec_.K, spec_.N, static_cast<const int8_t*>(packed_.get_data_handle()),
                       weight_sums_.data(), rq.src_zp, acc + n},
                num_threads());
      }
      epilogue(acc, M, rq, y);
      count_own_run();
      return;
    }
    if (!split_ || narrow(x, M * spec_.K, rq.src_zp)) {
      execute_matmul(M, const_cast<uint8_t*>(x), y, &rq, false);
      return;
    }
    counters_.ran_split();
    const auto split = split_input(x, M * spec_.K, rq.src_zp, M * spec_.N);
    const RunQuant split_rq{1.0f, split.zero_point, 1.0f, 0};
    execute_matmul(2 * M, split.halves, split.acc, &split_rq, true);
    epilogue(split.acc, M, rq, y);
  }

  // A run on gemv_u8 / gemm_f32 counts as a hit after the first, as a
  // primitive's runs do after the one that built it.
  void count_own_run() const {
    if (own_ran_.exchange(true, std::memory_order_relaxed)) counters_.hit();
  }

  // int32 sums [M, N] (zero point applied) to the op's output: u8 or f32.
  void epilogue(const int32_t* acc, int64_t M, const RunQuant& rq, void* y) const {
    const Epilogue e{rq.src_scale, spec_.weight_scales.data(), spec_.per_channel(),
                     spec_.bias.empty() ? nullptr : spec_.bias.data(),
                     spec_.clamp_min, spec_.clamp_max, rq.dst_scale, rq.dst_zp};
    if (spec_.static_int8()) {
      epilogue_u8(acc, M, spec_.N, 1, e, static_cast<uint8_t*>(y));
    } else {
      epilogue_f32(acc, M, spec_.N, 1, e, static_cast<float*>(y));
    }
  }

  void execute_matmul(int64_t M, void* src, void* dst, const RunQuant* rq, bool split,
                      const PostAct& post = {}) const {
    const int zps = needed_zero_points(quant_of(spec_, split), rq);
    const auto held = prims_.get(
        [M, split, zps, &post](const Prim& p) {
          return p.M == M && p.split == split && p.wanted_zps == zps && p.post == post;
        },
        [&] { return build(M, split, zps, post); }, [](const Prim&, const Prim&) { return true; });
    const Prim& prim = held->prim;
    const memory src_m({{M, spec_.K}, src_dt(), tag::ab}, engine(), src);
    const memory dst_m({{M, spec_.N}, dst_dt(split), tag::ab}, engine(), dst);
    ExecArgs args;
    args.add(DNNL_ARG_SRC, src_m);
    args.add(DNNL_ARG_WEIGHTS, prim.wei);
    args.add(DNNL_ARG_DST, dst_m);
    if (with_bias(split)) args.add(DNNL_ARG_BIAS, bias_);
    if (rq != nullptr) add_quant_args(args, quant_of(spec_, split), *rq, wei_scales_, prim.zps);
    execute(prim.primitive, args, prim.scratch_size, "matmul");
  }

  const bool split_;  // int8 without VNNI and wide weights: wide inputs run split (int8_split.h)
  memory packed_;
  std::shared_ptr<const void> keep_;  // the model file packed_ points into, if any
  memory bias_;
  memory wei_scales_;  // over spec_.weight_scales (int8)
  GemvVnni vnni(const uint8_t* x, int64_t M, int32_t zp, int32_t* acc) const {
    return GemvVnni{x, M, spec_.K, spec_.N, static_cast<const int8_t*>(packed_.get_data_handle()),
                    vnni_nstride_, vnni_kstride_, weight_sums_.data(), zp, acc};
  }

  std::vector<int32_t> weight_sums_;  // per output, where few rows run on gemv_u8.h / gemv_vnni.h
  int64_t vnni_nstride_ = 0, vnni_kstride_ = 0;  // gemv_vnni.h's layout, where it runs
  int64_t f32_nstride_ = 0, f32_kstride_ = 0;    // gemv_f32.h's layout, where it runs
  bool own_f32_ = false;  // fp32 packed "ba" with AVX2: few rows run on gemm_f32.h
  mutable std::atomic<bool> own_ran_{false};  // gemv_u8 / gemm_f32 ran once
  PrimCache<Prim> prims_{counters_, kMaxPrims};
};

}  // namespace

std::unique_ptr<LinearKernel> make_linear(const LinearSpec& spec, const void* weight) {
  return std::make_unique<OnednnLinear>(spec, weight);
}

std::unique_ptr<LinearKernel> load_linear(const LinearSpec& spec, const SavedForm& form) {
  return std::make_unique<OnednnLinear>(spec, form);
}

}  // namespace onednn_rt
}  // namespace qpack
