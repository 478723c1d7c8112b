// oneDNN linear on the matmul primitive: fp32, static int8 (u8 x s8 -> u8)
// and dynamic int8 (f32 quantized per call, u8 x s8 -> f32).
//
// The weight [N, K] is the matmul's B = [K, N] in layout "ba". It is reordered
// once into the layout the primitive asks for (format_tag::any, queried) and
// reordered back for unpack, which is exact (same data type, no scaling).
// Primitives are created per batch size M against that fixed packed layout and
// kept in a small copy-on-write map; runs take no lock. Every run uses a
// per-thread user-mode scratchpad.
//
// On ISAs without VNNI the int8 modes run split (int8_split.h): one u8 x s8
// -> s32 primitive over the two halves of the input stacked as 2M rows, and
// the epilogue in C++. The packed layout is queried with those attributes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/onednn/int8_split.h"
#include "backends/onednn/runtime.h"
#include "core/error.h"
#include "core/policy.h"
#include "core/linear.h"
#include "core/quant.h"

namespace qpack {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct Prim {
  int64_t M;
  dnnl::matmul primitive;
  size_t scratch_size;
  int threads;  // oneDNN plans the parallel split at creation: key on it
};
using PrimMap = std::vector<Prim>;

class OnednnLinear final : public LinearKernel {
 public:
  OnednnLinear(const LinearSpec& spec, const void* weight)
      : spec_(spec), split_(spec.mode != QPACK_MODE_F32 && !onednn_rt::isa_has_vnni()) {
    const auto& eng = onednn_rt::engine();
    try {
      // Pack with a representative batch; other batch sizes reuse the layout.
      onednn_rt::apply_num_threads();
      auto pd = make_pd(kPackBatch, memory::desc({spec_.K, spec_.N}, wei_dt(), tag::any));
      packed_md_ = pd.weights_desc();
      packed_ = memory(packed_md_, eng);
      memory plain({{spec_.K, spec_.N}, wei_dt(), tag::ba}, eng, const_cast<void*>(weight));
      onednn_rt::apply_num_threads();
      auto& strm = onednn_rt::stream();
      dnnl::reorder(plain, packed_).execute(strm, plain, packed_);
      strm.wait();
      if (with_bias()) {
        bias_ = memory({{1, spec_.N}, dt::f32, tag::ab}, eng,
                       const_cast<float*>(spec_.bias.data()));
      }
      prims_ = std::make_shared<const PrimMap>(PrimMap{
          Prim{kPackBatch, dnnl::matmul(pd), pd.scratchpad_desc().get_size(), num_threads()}});
    } catch (const dnnl::error& e) {
      fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN could not pack the weight: ", e.what());
    }
    counters_.states_built.fetch_add(1, std::memory_order_relaxed);
    if (spec_.mode != QPACK_MODE_F32) {
      wei_scales_ = spec_.weight_scales;
      for (int32_t zp : spec_.weight_zero_points) {
        check(zp == 0, QPACK_STATUS_UNSUPPORTED,
              "oneDNN int8 needs symmetric weights (zero point 0), got zero point ", zp,
              "; use backend='qnnpack' for asymmetric weights");
      }
    }
  }

  void run_f32(int64_t M, const float* x, float* y) const override {
    if (spec_.mode == QPACK_MODE_INT8_STATIC) LinearKernel::run_f32(M, x, y);
    counters_.runs.fetch_add(1, std::memory_order_relaxed);
    if (M == 0) return;
    if (spec_.mode == QPACK_MODE_F32) {
      execute(M, const_cast<float*>(x), y, nullptr);
      return;
    }
    // Dynamic: choose the input's parameters as PyTorch does, quantize, run u8 x s8 -> f32.
    const int64_t count = M * spec_.K;
    float lo, hi;
    min_max(x, count, &lo, &hi);
    QParams q = choose_qparams_u8(lo, hi);
    uint8_t* qx = quantize_buffer(static_cast<size_t>(count));
    quantize_u8_array(x, count, q, qx);
    RunQuant rq{q.scale, q.zero_point, 1.0f, 0};
    run_int8(M, qx, rq, y);
  }

  void run_u8(int64_t M, const uint8_t* x, float input_scale, int32_t input_zero_point,
              uint8_t* y) const override {
    if (spec_.mode != QPACK_MODE_INT8_STATIC) LinearKernel::run_u8(M, x, 0, 0, y);
    check_scale(input_scale, "input scale", -1);
    check_u8_zero_point(input_zero_point, "input zero point");
    counters_.runs.fetch_add(1, std::memory_order_relaxed);
    counters_.cache_hits.fetch_add(1, std::memory_order_relaxed);
    if (M == 0) return;
    RunQuant rq{input_scale, input_zero_point, spec_.output_scale, spec_.output_zero_point};
    run_int8(M, x, rq, y);
  }

  void unpack_weight(void* out) const override {
    try {
      const auto& eng = onednn_rt::engine();
      memory plain({{spec_.K, spec_.N}, wei_dt(), tag::ba}, eng, out);
      onednn_rt::apply_num_threads();
      auto& strm = onednn_rt::stream();
      memory packed = packed_;  // handles are shallow copies
      dnnl::reorder(packed, plain).execute(strm, packed, plain);
      strm.wait();
      return;
    } catch (const dnnl::error&) {
      // A layout with extra terms (int8 compensation) that oneDNN will not
      // reorder from: read the blocked values ourselves.
    }
    decode_blocked(out);
  }

  // Offset of element (k, n) in a oneDNN blocked layout: outer indices times
  // strides, plus the position inside the nest of inner blocks.
  void decode_blocked(void* out) const {
    check(packed_md_.get_format_kind() == memory::format_kind::blocked,
          QPACK_STATUS_INTERNAL, "packed oneDNN weight is not in a blocked layout");
    const auto strides = packed_md_.get_strides();
    const auto blks = packed_md_.get_inner_blks();
    const auto idxs = packed_md_.get_inner_idxs();
    const int nblks = packed_md_.get_inner_nblks();
    int64_t dim_block[2] = {1, 1};
    for (int i = 0; i < nblks; ++i) dim_block[idxs[i]] *= blks[i];
    const size_t es = spec_.weight_elem_size();
    const auto* base = static_cast<const uint8_t*>(packed_.get_data_handle());
    auto* dst = static_cast<uint8_t*>(out);
    for (int64_t k = 0; k < spec_.K; ++k) {
      for (int64_t n = 0; n < spec_.N; ++n) {
        const int64_t idx[2] = {k, n};
        int64_t off = (k / dim_block[0]) * strides[0] + (n / dim_block[1]) * strides[1];
        int64_t inner = 0;
        int64_t rem[2] = {dim_block[0], dim_block[1]};
        for (int i = 0; i < nblks; ++i) {
          const int d = static_cast<int>(idxs[i]);
          rem[d] /= blks[i];
          inner = inner * blks[i] + (idx[d] / rem[d]) % blks[i];
        }
        off += inner;
        std::memcpy(dst + (n * spec_.K + k) * es, base + off * es, es);
      }
    }
  }

  size_t nbytes_packed() const override {
    return packed_md_.get_size() + spec_.bias.size() * sizeof(float) +
           wei_scales_.size() * sizeof(float);
  }

 private:
  static constexpr int64_t kPackBatch = 64;
  static constexpr size_t kMaxPrims = 16;

  using RunQuant = onednn_rt::RunQuant;

  dt wei_dt() const { return spec_.mode == QPACK_MODE_F32 ? dt::f32 : dt::s8; }
  dt src_dt() const { return spec_.mode == QPACK_MODE_F32 ? dt::f32 : dt::u8; }
  dt dst_dt() const {
    if (split_) return dt::s32;
    return spec_.mode == QPACK_MODE_INT8_STATIC ? dt::u8 : dt::f32;
  }
  bool with_bias() const { return !spec_.bias.empty() && !split_; }

  dnnl::matmul::primitive_desc make_pd(int64_t M, const memory::desc& wei_md) const {
    const auto attr = onednn_rt::make_attr(
        spec_.mode != QPACK_MODE_F32, split_, spec_.mode == QPACK_MODE_INT8_STATIC,
        spec_.per_channel() ? (1 << 1) : 0, spec_.clamp_min, spec_.clamp_max);
    memory::desc src_md({M, spec_.K}, src_dt(), tag::ab);
    memory::desc dst_md({M, spec_.N}, dst_dt(), tag::ab);
    if (!with_bias()) {
      return dnnl::matmul::primitive_desc(onednn_rt::engine(), src_md, wei_md, dst_md, attr);
    }
    memory::desc bia_md({1, spec_.N}, dt::f32, tag::ab);
    return dnnl::matmul::primitive_desc(onednn_rt::engine(), src_md, wei_md, bia_md, dst_md,
                                        attr);
  }

  // Lock-free lookup; builders take build_mutex_ and publish a new map.
  const Prim& prim_for(int64_t M, std::shared_ptr<const PrimMap>& hold) const {
    const int threads = num_threads();
    hold = std::atomic_load(&prims_);
    for (const auto& p : *hold) {
      if (p.M == M && p.threads == threads) return p;
    }
    std::lock_guard<std::mutex> lock(build_mutex_);
    hold = std::atomic_load(&prims_);
    for (const auto& p : *hold) {
      if (p.M == M && p.threads == threads) return p;
    }
    dnnl::matmul::primitive_desc pd;
    try {
      onednn_rt::apply_num_threads();
      pd = make_pd(M, packed_md_);
    } catch (const dnnl::error& e) {
      fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN has no matmul for batch ", M,
           " with the packed weight layout: ", e.what());
    }
    auto next = std::make_shared<PrimMap>();
    next->push_back(Prim{M, dnnl::matmul(pd), pd.scratchpad_desc().get_size(), threads});
    for (const auto& p : *hold) {
      if (next->size() >= kMaxPrims) break;
      next->push_back(p);
    }
    std::shared_ptr<const PrimMap> published = std::move(next);
    std::atomic_store(&prims_, published);
    hold = published;
    return hold->front();
  }

  // Static (u8 out) or dynamic (f32 out) int8 on a u8 input.
  void run_int8(int64_t M, const uint8_t* x, const RunQuant& rq, void* y) const {
    if (!split_) {
      execute(M, const_cast<uint8_t*>(x), y, &rq);
      return;
    }
    const int64_t in = M * spec_.K, out = M * spec_.N;
    const auto split = onednn_rt::split_input(x, in, rq.src_zp, out);
    RunQuant split_rq{1.0f, split.zero_point, 1.0f, 0};
    execute(2 * M, split.halves, split.acc, &split_rq);
    const onednn_rt::Epilogue e{rq.src_scale, wei_scales_.data(), spec_.per_channel(),
                                spec_.bias.empty() ? nullptr : spec_.bias.data(),
                                spec_.clamp_min, spec_.clamp_max, rq.dst_scale, rq.dst_zp};
    if (spec_.mode == QPACK_MODE_INT8_STATIC) {
      onednn_rt::epilogue_u8(split.acc, M, spec_.N, 1, e, static_cast<uint8_t*>(y));
    } else {
      onednn_rt::epilogue_f32(split.acc, M, spec_.N, 1, e, static_cast<float*>(y));
    }
  }

  void execute(int64_t M, void* src, void* dst, const RunQuant* rq) const {
    std::shared_ptr<const PrimMap> hold;
    const Prim& prim = prim_for(M, hold);
    try {
      const auto& eng = onednn_rt::engine();
      memory src_m({{M, spec_.K}, src_dt(), tag::ab}, eng, src);
      memory dst_m({{M, spec_.N}, dst_dt(), tag::ab}, eng, dst);
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, packed_}, {DNNL_ARG_DST, dst_m}};
      if (with_bias()) args.emplace(DNNL_ARG_BIAS, bias_);
      if (prim.scratch_size > 0) {
        memory::desc sd({static_cast<int64_t>(prim.scratch_size)}, dt::u8, tag::a);
        args.emplace(DNNL_ARG_SCRATCHPAD,
                     memory(sd, eng, onednn_rt::scratchpad(prim.scratch_size)));
      }
      if (rq != nullptr) {  // split: the epilogue applies the scales
        onednn_rt::add_quant_args(args, *rq, wei_scales_, !split_,
                                  spec_.mode == QPACK_MODE_INT8_STATIC);
      }
      onednn_rt::apply_num_threads();
      auto& strm = onednn_rt::stream();
      prim.primitive.execute(strm, args);
      strm.wait();
    } catch (const dnnl::error& e) {
      fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN matmul failed: ", e.what());
    }
  }

  LinearSpec spec_;
  const bool split_;  // int8 without VNNI: split input, s32 primitive, C++ epilogue
  memory::desc packed_md_;
  memory packed_;
  memory bias_;
  std::vector<float> wei_scales_;
  mutable std::shared_ptr<const PrimMap> prims_;  // atomic_load/store only
  mutable std::mutex build_mutex_;
};

}  // namespace

std::unique_ptr<LinearKernel> make_onednn_linear(const LinearSpec& spec, const void* weight) {
  return std::make_unique<OnednnLinear>(spec, weight);
}

}  // namespace qpack
