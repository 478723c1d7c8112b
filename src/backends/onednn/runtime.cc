#include "backends/onednn/runtime.h"

#include "core/bytes.h"

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/policy.h"

namespace qpack {
namespace onednn_rt {
namespace {
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
struct Buffer {
  std::unique_ptr<void, FreeDeleter> data;
  size_t size = 0;
};
thread_local Buffer t_buffers[static_cast<int>(ThreadBuffer::count)];
thread_local std::unique_ptr<dnnl::stream> t_stream;

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "other";
  }
}
}  // namespace

BackendOps ops() {
  constexpr unsigned f32 = 1u << QPACK_MODE_F32, stat = 1u << QPACK_MODE_INT8_STATIC,
                     dyn = 1u << QPACK_MODE_INT8_DYNAMIC;
  BackendOps o;
  o.available = [] { return true; };
  o.describe = describe;
  o.int8_input_max = [] { return isa_has_vnni() ? 255 : 127; };
  o.asymmetric_weights = false;  // u8 x s8 with weight zero point 0 only
  o.build_id = build_id;
  o.isa = isa_name;
  o.linear = {f32 | stat | dyn, make_linear, load_linear};
  o.conv2d = {f32 | stat, make_conv, load_conv};
  return o;
}

const dnnl::engine& engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& stream() {
  if (!t_stream) t_stream = std::make_unique<dnnl::stream>(engine());
  return *t_stream;
}

void* thread_buffer(ThreadBuffer which, size_t size) {
  if (size == 0) return nullptr;
  Buffer& b = t_buffers[static_cast<int>(which)];
  if (b.size < size) {
    void* p = nullptr;
    check(posix_memalign(&p, 64, size) == 0 && p != nullptr, QPACK_STATUS_OUT_OF_MEMORY,
          "could not allocate a ", size, "-byte oneDNN work buffer");
    b.data.reset(p);
    b.size = size;
  }
  return b.data.get();
}

bool isa_has_avx512_vnni() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_fp16:
    case dnnl::cpu_isa::avx512_core_amx:
    case dnnl::cpu_isa::avx512_core_amx_fp16:
      return true;
    default:
      return false;
  }
}

bool isa_has_avx512_core() {
  return dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core || isa_has_avx512_vnni();
}

bool isa_has_avx2() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx2:
    case dnnl::cpu_isa::avx2_vnni:
    case dnnl::cpu_isa::avx2_vnni_2:
    case dnnl::cpu_isa::avx512_core:
      return true;
    default:
      return isa_has_avx512_vnni();
  }
}

bool isa_has_vnni() {
  const auto isa = dnnl::get_effective_cpu_isa();
  // sse41, avx, avx2, avx512_core: vpmaddubsw saturates
  return isa == dnnl::cpu_isa::avx2_vnni || isa == dnnl::cpu_isa::avx2_vnni_2 ||
         isa_has_avx512_vnni();
}

void apply_num_threads() {
  int n = num_threads();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

std::string describe() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << "oneDNN " << v->major << "." << v->minor << "." << v->patch << " (" << v->hash
     << "); cpu_runtime=OpenMP; isa=" << isa_name(dnnl::get_effective_cpu_isa());
  return os.str();
}

Quant quant_of(const OpSpec& spec, bool split) {
  if (!spec.int8()) return Quant::none;
  if (split) return Quant::split;
  return spec.static_int8() ? Quant::static_out : Quant::dynamic;
}

dnnl::primitive_attr make_attr(Quant quant, int wei_scale_mask, float clamp_min,
                               float clamp_max, int zps) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto src_zero_point = [&] {
    if (quant != Quant::static_out || (zps & kSrcZp)) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  };
  auto src_wei_scales = [&] {
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, wei_scale_mask);
  };
  auto dst_quant = [&] {
    attr.set_scales_mask(DNNL_ARG_DST, 0);
    if (zps & kDstZp) attr.set_zero_points_mask(DNNL_ARG_DST, 0);
  };
  auto clamp_post_op = [&] {
    const bool lo = !std::isinf(clamp_min), hi = !std::isinf(clamp_max);
    if (!lo && !hi) return;
    dnnl::post_ops po;
    if (lo && clamp_min == 0.0f && !hi) {
      po.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    } else {
      po.append_eltwise(dnnl::algorithm::eltwise_clip, lo ? clamp_min : -3.0e38f,
                        hi ? clamp_max : 3.0e38f);
    }
    attr.set_post_ops(po);
  };
  switch (quant) {
    case Quant::none: clamp_post_op(); break;
    case Quant::split: src_zero_point(); break;  // the epilogue does the rest
    case Quant::dynamic: src_wei_scales(); src_zero_point(); clamp_post_op(); break;
    case Quant::static_out:
      src_wei_scales(); src_zero_point(); dst_quant(); clamp_post_op(); break;
  }
  return attr;
}

bool eltwise_of(qpack_activation act, float lo, float hi, dnnl::algorithm* alg, float* alpha, float* beta) {
  using a = dnnl::algorithm;
  *alpha = 0.0f;
  *beta = 0.0f;
  switch (act) {
    case QPACK_ACT_RELU: *alg = a::eltwise_relu; return true;
    case QPACK_ACT_LEAKY_RELU: *alg = a::eltwise_relu; *alpha = lo; return true;
    case QPACK_ACT_CLAMP: *alg = a::eltwise_clip; *alpha = lo; *beta = hi; return true;
    // x * max(0, min(1, x / 6 + 1 / 2)) and max(0, min(1, x / 6 + 1 / 2))
    case QPACK_ACT_HARDSWISH: *alg = a::eltwise_hardswish; *alpha = 1.0f / 6.0f; *beta = 0.5f; return true;
    case QPACK_ACT_HARDSIGMOID: *alg = a::eltwise_hardsigmoid; *alpha = 1.0f / 6.0f; *beta = 0.5f; return true;
    case QPACK_ACT_SIGMOID: *alg = a::eltwise_logistic; return true;
    case QPACK_ACT_SILU: *alg = a::eltwise_swish; *alpha = 1.0f; return true;
    case QPACK_ACT_GELU: *alg = a::eltwise_gelu_erf; return true;
    default: return false;
  }
}

dnnl::memory constant_f32(const float* values, int64_t count) {
  const dnnl::memory::desc md({count}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
  return dnnl::memory(md, engine(), const_cast<float*>(values));
}

namespace {
// The calling thread's run-time scalars and the memories over them, made once.
struct Scalars {
  float src_scale = 1, dst_scale = 1;
  int32_t src_zp = 0, dst_zp = 0;
  dnnl::memory m_src_scale, m_dst_scale, m_src_zp, m_dst_zp;
};
Scalars& thread_scalars() {
  thread_local std::unique_ptr<Scalars> t;
  if (!t) {
    t = std::make_unique<Scalars>();
    using dnnl::memory;
    const memory::desc f1({1}, memory::data_type::f32, memory::format_tag::a);
    const memory::desc i1({1}, memory::data_type::s32, memory::format_tag::a);
    t->m_src_scale = memory(f1, engine(), &t->src_scale);
    t->m_dst_scale = memory(f1, engine(), &t->dst_scale);
    t->m_src_zp = memory(i1, engine(), &t->src_zp);
    t->m_dst_zp = memory(i1, engine(), &t->dst_zp);
  }
  return *t;
}

// The calling thread's scratchpad as a memory of at least `size` bytes.
const dnnl::memory& thread_scratchpad(size_t size) {
  thread_local dnnl::memory t_mem;
  thread_local size_t t_size = 0;
  if (size > t_size) {
    const dnnl::memory::desc md({static_cast<int64_t>(size)}, dnnl::memory::data_type::u8,
                                dnnl::memory::format_tag::a);
    t_mem = dnnl::memory(md, engine(), thread_buffer(ThreadBuffer::scratchpad, size));
    t_size = size;
  }
  return t_mem;
}
}  // namespace

int needed_zero_points(Quant quant, const RunQuant* q) {
  if (q == nullptr || quant != Quant::static_out) return kBothZp;
  return (q->src_zp != 0 ? kSrcZp : 0) | (q->dst_zp != 0 ? kDstZp : 0);
}

bool same_blocking(const dnnl::memory::desc& a, const dnnl::memory::desc& b) {
  if (a.get_format_kind() != dnnl::memory::format_kind::blocked ||
      b.get_format_kind() != dnnl::memory::format_kind::blocked) {
    return false;
  }
  BlockedLayout x = BlockedLayout::of(a, false), y = BlockedLayout::of(b, false);
  // a: s8 with no extra terms of its own (its bytes are the values, padding included)
  const bool plain_s8 = a.get_data_type() == dnnl::memory::data_type::s8 &&
                        static_cast<int64_t>(a.get_size()) == x.span();
  x.size = y.size = 0;
  return plain_s8 && x == y;
}

void add_quant_args(ExecArgs& args, Quant quant, const RunQuant& q, const dnnl::memory& wei_scales,
                    int zps) {
  if (quant == Quant::none) return;
  Scalars& t = thread_scalars();
  t.src_zp = q.src_zp;
  if (quant != Quant::static_out || (zps & kSrcZp)) {
    args.add(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, t.m_src_zp);
  }
  if (quant == Quant::split) return;
  t.src_scale = q.src_scale;
  args.add(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, t.m_src_scale);
  args.add(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, wei_scales);
  if (quant != Quant::static_out) return;
  t.dst_scale = q.dst_scale;
  t.dst_zp = q.dst_zp;
  args.add(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, t.m_dst_scale);
  if (zps & kDstZp) args.add(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, t.m_dst_zp);
}

void execute(const dnnl::primitive& prim, ExecArgs& args, size_t scratch_size, const char* what) {
  try {
    if (scratch_size > 0) args.add(DNNL_ARG_SCRATCHPAD, thread_scratchpad(scratch_size));
    apply_num_threads();
    auto& strm = stream();
    const dnnl_status_t st = dnnl_primitive_execute(prim.get(), strm.get(), args.size(), args.data());
    if (st != dnnl_success) throw dnnl::error(st, "dnnl_primitive_execute");
    strm.wait();
  } catch (const dnnl::error& e) {
    fail(QPACK_STATUS_BACKEND_ERROR, "oneDNN ", what, " failed: ", e.what());
  }
}

void reorder(const dnnl::memory& src, const dnnl::memory& dst) {
  apply_num_threads();
  auto& strm = stream();
  dnnl::memory s = src, d = dst;  // handles are shallow copies
  dnnl::reorder(s, d).execute(strm, s, d);
  strm.wait();
}

void unpack(const dnnl::memory& packed, const dnnl::memory& plain, size_t elem_size) {
  try {
    reorder(packed, plain);
    return;
  } catch (const dnnl::error&) {
    // A layout with extra terms (int8 compensation) that oneDNN will not
    // reorder from: read the blocked values ourselves.
  }
  decode_blocked(packed.get_desc(), packed.get_data_handle(), elem_size,
                 plain.get_data_handle());
}

BlockedLayout BlockedLayout::of(const dnnl::memory::desc& md, bool split) {
  check(md.get_format_kind() == dnnl::memory::format_kind::blocked, QPACK_STATUS_INTERNAL,
        "packed oneDNN weight is not in a blocked layout");
  BlockedLayout l;
  l.data_type = static_cast<uint32_t>(md.get_data_type());
  l.split = split ? 1 : 0;
  const auto dims = md.get_dims();
  const auto strides = md.get_strides();
  const auto blks = md.get_inner_blks();
  const auto idxs = md.get_inner_idxs();
  l.ndims = static_cast<int32_t>(dims.size());
  l.nblks = md.get_inner_nblks();
  check(l.ndims <= kMaxDims && l.nblks <= kMaxDims, QPACK_STATUS_INTERNAL,
        "packed oneDNN weight has too many dimensions or blocks");
  for (int i = 0; i < l.ndims; ++i) {
    l.dims[i] = dims[i];
    l.strides[i] = strides[i];
  }
  for (int i = 0; i < l.nblks; ++i) {
    l.blks[i] = blks[i];
    l.idxs[i] = idxs[i];
  }
  l.size = md.get_size();
  return l;
}

namespace {
constexpr uint32_t kLayoutTag = 0x4C4E4E44;  // "DNNL"
constexpr uint32_t kLayoutVersion = 1;

// Calls f(offset_in_elements) for every element of the layout, row-major.
template <typename F>
void for_each_offset(const BlockedLayout& l, F f) {
  const int nd = l.ndims;
  int64_t dim_block[BlockedLayout::kMaxDims], idx[BlockedLayout::kMaxDims] = {},
      rem[BlockedLayout::kMaxDims];
  for (int d = 0; d < nd; ++d) dim_block[d] = 1;
  for (int i = 0; i < l.nblks; ++i) dim_block[l.idxs[i]] *= l.blks[i];
  int64_t total = 1;
  for (int d = 0; d < nd; ++d) total *= l.dims[d];
  for (int64_t linear = 0; linear < total; ++linear) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) {
      off += (idx[d] / dim_block[d]) * l.strides[d];
      rem[d] = dim_block[d];
    }
    int64_t inner = 0;
    for (int i = 0; i < l.nblks; ++i) {
      const int d = static_cast<int>(l.idxs[i]);
      rem[d] /= l.blks[i];
      inner = inner * l.blks[i] + (idx[d] / rem[d]) % l.blks[i];
    }
    f(linear, off + inner);
    for (int d = nd - 1; d >= 0; --d) {  // next index, row-major
      if (++idx[d] < l.dims[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

int64_t BlockedLayout::span() const {
  // the last element's offset: every outer index at its last block, every
  // inner index at its last element; plus one
  int64_t dim_block[kMaxDims];
  for (int d = 0; d < ndims; ++d) dim_block[d] = 1;
  for (int i = 0; i < nblks; ++i) dim_block[idxs[i]] *= blks[i];
  int64_t last = 0, inner = 1;
  for (int i = 0; i < nblks; ++i) inner *= blks[i];
  for (int d = 0; d < ndims; ++d) {
    if (dims[d] == 0) return 0;
    last += (dims[d] + dim_block[d] - 1) / dim_block[d] * strides[d] - strides[d];
  }
  return last + inner;
}

std::vector<uint8_t> BlockedLayout::bytes() const {
  ByteWriter w;
  w.put(kLayoutTag);
  w.put(kLayoutVersion);
  w.put(data_type);
  w.put(split);
  w.put(ndims);
  for (int i = 0; i < ndims; ++i) w.put(dims[i]);
  for (int i = 0; i < ndims; ++i) w.put(strides[i]);
  w.put(nblks);
  for (int i = 0; i < nblks; ++i) w.put(blks[i]);
  for (int i = 0; i < nblks; ++i) w.put(idxs[i]);
  w.put(size);
  for (int64_t v : problem) w.put(v);
  return w.take();
}

BlockedLayout BlockedLayout::parse(const std::vector<uint8_t>& bytes, const std::string& what) {
  ByteReader r(bytes.data(), bytes.size(), what + "'s oneDNN layout");
  r.expect(r.get<uint32_t>() == kLayoutTag, "tag");
  r.expect(r.get<uint32_t>() == kLayoutVersion, "version (written by a newer qpack?)");
  BlockedLayout l;
  l.data_type = r.get<uint32_t>();
  r.expect(l.data_type == static_cast<uint32_t>(dnnl::memory::data_type::f32) ||
               l.data_type == static_cast<uint32_t>(dnnl::memory::data_type::s8),
           "data type");
  l.split = r.get<uint32_t>();
  r.expect(l.split <= 1, "split flag");
  l.ndims = r.get<int32_t>();
  r.expect(l.ndims >= 1 && l.ndims <= kMaxDims, "number of dimensions");
  for (int i = 0; i < l.ndims; ++i) {
    l.dims[i] = r.get<int64_t>();
    r.expect(l.dims[i] >= 1 && l.dims[i] <= (int64_t(1) << 31), "dimension");
  }
  for (int i = 0; i < l.ndims; ++i) {
    l.strides[i] = r.get<int64_t>();
    r.expect(l.strides[i] >= 0 && l.strides[i] <= (int64_t(1) << 40), "stride");
  }
  l.nblks = r.get<int32_t>();
  r.expect(l.nblks >= 0 && l.nblks <= kMaxDims, "number of inner blocks");
  int64_t dim_block[kMaxDims] = {1, 1, 1, 1, 1, 1};
  for (int i = 0; i < l.nblks; ++i) {
    l.blks[i] = r.get<int64_t>();
    r.expect(l.blks[i] >= 1 && l.blks[i] <= 4096, "inner block");
  }
  for (int i = 0; i < l.nblks; ++i) {
    l.idxs[i] = r.get<int64_t>();
    r.expect(l.idxs[i] >= 0 && l.idxs[i] < l.ndims, "inner block index");
    dim_block[l.idxs[i]] *= l.blks[i];
    r.expect(dim_block[l.idxs[i]] <= 4096, "inner blocks");
  }
  l.size = r.get<uint64_t>();
  for (int64_t& v : l.problem) v = r.get<int64_t>();
  r.expect(r.remaining() == 0, "length");
  // Every element inside the packed bytes: the largest offset is reached at
  // the last index of each dimension (offsets grow with every index).
  const size_t elem = l.data_type == static_cast<uint32_t>(dnnl::memory::data_type::f32) ? 4 : 1;
  // Checked arithmetic: a hostile layout (dims 2^31, strides 2^40, six blocks
  // of 4096) overflows int64.
  const char* outside = "element offsets (outside the packed bytes)";
  int64_t max_off = 0;
  for (int d = 0; d < l.ndims; ++d) {
    int64_t term = 0;
    r.expect(!__builtin_mul_overflow((l.dims[d] - 1) / dim_block[d], l.strides[d], &term) &&
                 !__builtin_add_overflow(max_off, term, &max_off),
             outside);
  }
  int64_t inner = 1;
  for (int i = 0; i < l.nblks; ++i) r.expect(!__builtin_mul_overflow(inner, l.blks[i], &inner), outside);
  r.expect(!__builtin_add_overflow(max_off, inner - 1, &max_off), outside);
  r.expect(static_cast<uint64_t>(max_off) < l.size / elem, outside);
  return l;
}

bool BlockedLayout::operator==(const BlockedLayout& o) const {
  if (data_type != o.data_type || split != o.split || ndims != o.ndims || nblks != o.nblks ||
      size != o.size) {
    return false;
  }
  for (int i = 0; i < ndims; ++i) {
    if (dims[i] != o.dims[i] || strides[i] != o.strides[i]) return false;
  }
  for (int i = 0; i < nblks; ++i) {
    if (blks[i] != o.blks[i] || idxs[i] != o.idxs[i]) return false;
  }
  return true;
}

std::string BlockedLayout::str() const {
  std::ostringstream os;
  os << (data_type == static_cast<uint32_t>(dnnl::memory::data_type::f32) ? "f32" : "s8") << " [";
  for (int i = 0; i < ndims; ++i) os << (i ? "," : "") << dims[i];
  os << "] blocks ";
  for (int i = 0; i < nblks; ++i) os << (i ? "," : "") << blks[i] << "@" << idxs[i];
  if (nblks == 0) os << "none";
  os << (split ? " split" : "") << " " << size << " B";
  return os.str();
}

void decode_blocked(const BlockedLayout& l, const void* data, size_t elem_size, void* out) {
  const auto* base = static_cast<const uint8_t*>(data);
  auto* dst = static_cast<uint8_t*>(out);
  for_each_offset(l, [&](int64_t linear, int64_t off) {
    std::memcpy(dst + linear * elem_size, base + off * elem_size, elem_size);
  });
}

void decode_blocked(const dnnl::memory::desc& md, const void* data, size_t elem_size,
                    void* out) {
  decode_blocked(BlockedLayout::of(md, false), data, elem_size, out);
}

std::string build_id() {
  const dnnl_version_t* v = dnnl_version();
  std::ostringstream os;
  os << "onednn " << v->major << "." << v->minor << "." << v->patch << " " << v->hash << " pack 1";
  return os.str();
}

std::string isa_name() { return isa_name(dnnl::get_effective_cpu_isa()); }

}  // namespace onednn_rt
}  // namespace qpack
