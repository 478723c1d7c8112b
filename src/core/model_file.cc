// The .qpk file: writer and reader (docs/FORMAT.md is the byte-by-byte
// description; keep the two in step).
#include "core/model_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "core/bytes.h"
#include "core/error.h"
#include "core/registry.h"

#ifndef QPACK_VERSION_STRING
#define QPACK_VERSION_STRING "0.0.0"
#endif

namespace qpack {
namespace {

// ---- layout constants (docs/FORMAT.md) ----------------------------------------

const uint8_t kMagic[8] = {0x89, 'Q', 'P', 'K', '\r', '\n', 0x1a, '\n'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kByteOrder = 0x01020304;
constexpr size_t kHeaderSize = 256;
constexpr size_t kEntrySize = 32;
constexpr size_t kPage = 4096;
constexpr size_t kBlobAlign = 64;
constexpr uint32_t kMaxSections = 1u << 20;

enum SectionType : uint32_t {
  kOp = 1, kPacked = 2, kOriginal = 3, kGraph = 4, kHost = 5, kData = 6
};

// Header fields: offset and size.
struct Field {
  size_t offset, size;
};
constexpr Field kQpackVersion{40, 16}, kOnednnBuild{56, 64}, kQnnpackBuild{120, 64},
    kOnednnIsa{184, 32}, kQnnpackIsa{216, 16};
constexpr size_t kTableChecksum = 232, kHeaderChecksum = 248;

struct Section {
  uint32_t type = 0, flags = 0;
  uint64_t offset = 0, size = 0, checksum = 0;
};

uint64_t checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

template <typename T>
void store(uint8_t* p, size_t offset, T v) {
  std::memcpy(p + offset, &v, sizeof v);
}
template <typename T>
T load(const uint8_t* p, size_t offset) {
  T v;
  std::memcpy(&v, p + offset, sizeof v);
  return v;
}

void store_text(uint8_t* header, Field f, const std::string& s) {
  std::memcpy(header + f.offset, s.data(), std::min(s.size(), f.size - 1));
}
std::string load_text(const uint8_t* header, Field f) {
  const char* p = reinterpret_cast<const char*>(header + f.offset);
  return std::string(p, strnlen(p, f.size));
}

// Each backend's build identifier and ISA field in the header.
struct BackendFields {
  qpack_backend id;
  Field build, isa;
};
constexpr BackendFields kBackendFields[] = {
    {QPACK_BACKEND_ONEDNN, kOnednnBuild, kOnednnIsa},
    {QPACK_BACKEND_QNNPACK, kQnnpackBuild, kQnnpackIsa},
};

const char* node_op_name(const ModelOp& op) { return op.linear ? "linear" : "conv2d"; }

// ---- op records -----------------------------------------------------------------

void put_common(ByteWriter& w, const OpSpec& s) {
  w.put_vec(s.weight_scales);
  w.append(s.weight_zero_points.data(), s.weight_zero_points.size() * sizeof(int32_t));
  w.put_vec(s.bias);
  w.put(s.clamp_min);
  w.put(s.clamp_max);
  w.put(s.input_scale);
  w.put(s.input_zero_point);
  w.put(s.output_scale);
  w.put(s.output_zero_point);
}

std::vector<uint8_t> op_record(const ModelOp& op, const PackedForm& form, uint32_t packed_section,
                               int32_t original_section) {
  ByteWriter w;
  const OpSpec& s = op.linear ? static_cast<const OpSpec&>(op.linear->spec())
                              : static_cast<const OpSpec&>(op.conv->spec());
  w.put<uint32_t>(op.linear ? 0 : 1);
  w.put<uint32_t>(s.backend);
  w.put<uint32_t>(s.mode);
  w.put(packed_section);
  w.put(original_section);
  if (op.linear) {
    const LinearSpec& l = op.linear->spec();
    w.put<uint32_t>(2);
    w.put(l.K);
    w.put(l.N);
  } else {
    const ConvSpec& c = op.conv->spec();
    const int64_t g[13] = {c.IC,    c.OC,    c.groups, c.KH,    c.KW,    c.stride_h, c.stride_w,
                           c.pad_t, c.pad_l, c.pad_b,  c.pad_r, c.dil_h, c.dil_w};
    w.put<uint32_t>(13);
    for (int64_t v : g) w.put(v);
  }
  put_common(w, s);
  w.put_vec(form.layout);
  return w.take();
}

// The common params fields of a saved op, as its create call takes them.
struct SavedCommon {
  qpack_mode mode;
  qpack_backend backend;
  std::vector<float> weight_scales, bias;
  std::vector<int32_t> weight_zero_points;
  float clamp_min, clamp_max, input_scale, output_scale;
  int32_t input_zero_point, output_zero_point;

  template <typename P>
  void fill(P* p) const {
    p->mode = mode;
    p->backend = backend;
    p->weight = nullptr;
    p->weight_scales = weight_scales.empty() ? nullptr : weight_scales.data();
    p->weight_zero_points = weight_zero_points.empty() ? nullptr : weight_zero_points.data();
    p->num_weight_scales = static_cast<int64_t>(weight_scales.size());
    p->bias = bias.empty() ? nullptr : bias.data();
    p->clamp_min = clamp_min;
    p->clamp_max = clamp_max;
    p->input_scale = input_scale;
    p->input_zero_point = input_zero_point;
    p->output_scale = output_scale;
    p->output_zero_point = output_zero_point;
  }
};

constexpr size_t kMaxChannels = size_t(1) << 24;

// ---- graph records -------------------------------------------------------------

std::vector<uint8_t> graph_record(const Graph& g,
                                  const std::unordered_map<const void*, int32_t>& index) {
  ByteWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(g.values().size()));
  for (const auto& v : g.values()) {
    w.put<uint32_t>(v.dtype);
    w.put(v.scale);
    w.put(v.zero_point);
  }
  auto put_ints = [&w](const std::vector<int>& v) {
    w.put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (int i : v) w.put<int32_t>(i);
  };
  put_ints(g.inputs());
  put_ints(g.outputs());
  w.put<uint32_t>(static_cast<uint32_t>(g.nodes().size()));
  for (const auto& n : g.nodes()) {
    w.put<uint32_t>(n.kind);
    put_ints(n.in);
    w.put<int32_t>(n.out);
    const void* key = n.linear ? static_cast<const void*>(n.linear.get())
                    : n.conv   ? static_cast<const void*>(n.conv.get())
                               : nullptr;
    w.put<int32_t>(key ? index.at(key) : -1);
    for (int64_t v : n.kernel) w.put(v);
    for (int64_t v : n.stride) w.put(v);
    for (int64_t v : n.pad) w.put(v);
    w.put<uint8_t>(n.ceil_mode);
    w.put<uint8_t>(n.count_include_pad);
    w.put<uint8_t>(n.keepdim);
    w.put<uint8_t>(0);
    w.put<uint32_t>(n.act);
    w.put(n.act_min);
    w.put(n.act_max);
    w.put_vec(n.affine_scale);
    w.append(n.affine_shift.data(), n.affine_shift.size() * sizeof(float));
  }
  return w.take();
}

std::shared_ptr<Graph> read_graph(ByteReader& r, const std::vector<ModelOp>& ops) {
  constexpr size_t kMax = size_t(1) << 20;
  const uint32_t num_values = r.get<uint32_t>();
  r.expect(num_values >= 1 && num_values <= kMax && num_values <= r.remaining() / 12, "value count");
  std::vector<GraphValue> values(num_values);
  for (auto& v : values) {
    const uint32_t dtype = r.get<uint32_t>();
    r.expect(dtype <= QPACK_DTYPE_U8, "value dtype");
    v.dtype = static_cast<qpack_dtype>(dtype);
    v.scale = r.get<float>();
    v.zero_point = r.get<int32_t>();
  }
  auto get_ints = [&r](size_t max, const char* field) {
    const auto v = r.get_vec<int32_t>(max, field);
    return std::vector<int>(v.begin(), v.end());
  };
  std::vector<int> inputs = get_ints(kMax, "input count");
  std::vector<int> outputs = get_ints(kMax, "output count");
  const uint32_t num_nodes = r.get<uint32_t>();
  r.expect(num_nodes <= kMax && num_nodes <= r.remaining() / 16, "node count");
  std::vector<GraphNode> nodes(num_nodes);
  for (auto& n : nodes) {
    const uint32_t kind = r.get<uint32_t>();
    r.expect(kind <= kLastNodeKind, "node kind");
    n.kind = static_cast<qpack_node_kind>(kind);
    n.in = get_ints(8, "node input count");
    r.expect(!n.in.empty(), "node input count");
    n.out = r.get<int32_t>();
    const int32_t op = r.get<int32_t>();
    r.expect(op >= -1 && op < static_cast<int32_t>(ops.size()), "node op index");
    const bool weighted = kind == QPACK_NODE_CONV2D || kind == QPACK_NODE_LINEAR;
    r.expect(weighted == (op >= 0), "node op index");
    if (op >= 0) {
      r.expect(kind == QPACK_NODE_CONV2D ? ops[op].conv != nullptr : ops[op].linear != nullptr,
               "node op (the op is of another kind)");
      n.conv = ops[op].conv;
      n.linear = ops[op].linear;
    }
    for (int64_t& v : n.kernel) v = r.get<int64_t>();
    for (int64_t& v : n.stride) v = r.get<int64_t>();
    for (int64_t& v : n.pad) v = r.get<int64_t>();
    n.ceil_mode = r.get<uint8_t>() != 0;
    n.count_include_pad = r.get<uint8_t>() != 0;
    n.keepdim = r.get<uint8_t>() != 0;
    r.get<uint8_t>();
    const uint32_t act = r.get<uint32_t>();
    r.expect(act <= kLastActivation, "node activation");
    n.act = static_cast<qpack_activation>(act);
    n.act_min = r.get<float>();
    n.act_max = r.get<float>();
    // AFFINE, LAYER_NORM: scale then shift; PRELU: the slopes alone; CONSTANT: its values;
    // PERMUTE_ROWS: its permutation
    n.affine_scale = r.get_vec<float>(kMaxChannels, "affine channel count");
    const bool shifted = kind == QPACK_NODE_AFFINE || kind == QPACK_NODE_LAYER_NORM;
    const size_t c = shifted ? n.affine_scale.size() : 0;
    r.expect(c <= r.remaining() / sizeof(float), "affine shift");
    n.affine_shift.resize(c);
    if (c > 0) std::memcpy(n.affine_shift.data(), r.take(c * sizeof(float)), c * sizeof(float));
    const bool held = shifted || kind == QPACK_NODE_PRELU || kind == QPACK_NODE_CONSTANT ||
                      kind == QPACK_NODE_PERMUTE_ROWS;
    r.expect(kind == QPACK_NODE_ATTENTION || held == !n.affine_scale.empty(), "affine channel count");
  }
  r.expect(r.remaining() == 0, "length");
  // The graph's own validation (types, wiring, parameters) as qpack_graph_create.
  return std::make_shared<Graph>(std::move(values), std::move(nodes), std::move(inputs),
                                 std::move(outputs));
}

// ---- files ----------------------------------------------------------------------

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  fail(QPACK_STATUS_IO, what, " ", path, ": ", std::strerror(errno));
}

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io_fail("could not write", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// The bytes of a file: mapped read-only and shared, or read into memory.
struct FileBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool mapped = false;
  ~FileBytes() {
    if (data == nullptr) return;
    if (mapped) {
      ::munmap(const_cast<uint8_t*>(data), size);
    } else {
      std::free(const_cast<uint8_t*>(data));
    }
  }
};

std::shared_ptr<const FileBytes> open_file(const std::string& path, bool map, int given_fd) {
  Fd f;
  f.fd = given_fd >= 0 ? given_fd : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) io_fail("could not open", path);
  struct Release {  // a given descriptor stays open
    Fd& f;
    int given;
    ~Release() {
      if (given >= 0) f.fd = -1;
    }
  } release{f, given_fd};
  struct stat st;
  if (::fstat(f.fd, &st) != 0) io_fail("could not stat", path);
  check(S_ISREG(st.st_mode), QPACK_STATUS_IO, path, " is not a regular file");
  auto bytes = std::make_shared<FileBytes>();
  bytes->size = static_cast<size_t>(st.st_size);
  check(bytes->size >= kHeaderSize, QPACK_STATUS_FILE_FORMAT, path, " is ", bytes->size,
        " bytes, shorter than a qpack model file's header (", kHeaderSize,
        "): truncated, or not a .qpk file");
  if (map) {
    void* p = ::mmap(nullptr, bytes->size, PROT_READ, MAP_SHARED, f.fd, 0);
    if (p == MAP_FAILED) io_fail("could not map", path);
    bytes->data = static_cast<const uint8_t*>(p);
    bytes->mapped = true;
    return bytes;
  }
  void* p = nullptr;
  check(posix_memalign(&p, kPage, bytes->size) == 0, QPACK_STATUS_OUT_OF_MEMORY,
        "could not allocate ", bytes->size, " bytes to read ", path);
  bytes->data = static_cast<const uint8_t*>(p);
  size_t done = 0;
  while (done < bytes->size) {
    const ssize_t n = ::pread(f.fd, static_cast<uint8_t*>(p) + done, bytes->size - done,
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_fail("could not read", path);
    check(n > 0, QPACK_STATUS_FILE_FORMAT, path, " shrank while it was read");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

}  // namespace

// ---- save -----------------------------------------------------------------------

void save_model(const std::string& path, std::vector<ModelOp> ops,
                const std::vector<std::shared_ptr<const Graph>>& graphs, const void* host,
                size_t host_size, const std::vector<Blob>& data, bool with_originals) {
  std::unordered_map<const void*, int32_t> index;
  for (size_t i = 0; i < ops.size(); ++i) {
    check(index.emplace(ops[i].key(), static_cast<int32_t>(i)).second, QPACK_STATUS_INVALID_ARGUMENT,
          "op ", i, " is listed twice");
  }
  for (const auto& g : graphs) {
    for (const auto& n : g->nodes()) {
      if (!n.linear && !n.conv) continue;
      ModelOp op{n.linear, n.conv};
      if (index.emplace(op.key(), static_cast<int32_t>(ops.size())).second) ops.push_back(op);
    }
  }
  check(ops.size() * 3 + graphs.size() + data.size() + 1 < kMaxSections,
        QPACK_STATUS_INVALID_ARGUMENT, "too many ops and arrays for one file");

  // Packed forms and originals, held until written.
  std::vector<PackedForm> forms;
  std::vector<std::vector<uint8_t>> originals(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const ModelOp& op = ops[i];
    forms.push_back(op.linear ? op.linear->kernel().packed_form() : op.conv->kernel().packed_form());
    const bool held = op.linear ? op.linear->has_original() : op.conv->has_original();
    if (with_originals && held) {
      originals[i].resize(op.linear ? op.linear->spec().weight_nbytes() : op.conv->spec().weight_nbytes());
      if (op.linear) {
        op.linear->unpack(originals[i].data(), nullptr);
      } else {
        op.conv->unpack(originals[i].data(), nullptr);
      }
    }
  }

  // Table order: OP..., GRAPH..., HOST, PACKED..., DATA..., ORIGINAL...
  const uint32_t n_ops = static_cast<uint32_t>(ops.size());
  const uint32_t n_small = n_ops + static_cast<uint32_t>(graphs.size()) + (host_size > 0 ? 1 : 0);
  std::vector<Section> table;
  std::vector<std::vector<uint8_t>> small;  // bytes of the small sections, in table order
  uint32_t next_original = n_small + n_ops + static_cast<uint32_t>(data.size());
  for (uint32_t i = 0; i < n_ops; ++i) {
    const int32_t orig = originals[i].empty() ? -1 : static_cast<int32_t>(next_original++);
    small.push_back(op_record(ops[i], forms[i], n_small + i, orig));
  }
  for (const auto& g : graphs) small.push_back(graph_record(*g, index));
  size_t offset = kHeaderSize + kEntrySize * static_cast<size_t>(next_original);
  for (uint32_t i = 0; i < small.size(); ++i) {
    offset = align_up(offset, 8);
    const uint32_t type = i < n_ops ? kOp : kGraph;
    table.push_back(Section{type, 0, offset, small[i].size(), checksum(small[i].data(), small[i].size())});
    offset += small[i].size();
  }
  if (host_size > 0) {
    offset = align_up(offset, 8);
    table.push_back(Section{kHost, 0, offset, host_size, checksum(host, host_size)});
    offset += host_size;
  }
  offset = align_up(offset, kPage);
  for (uint32_t i = 0; i < n_ops; ++i) {
    offset = align_up(offset, kBlobAlign);
    table.push_back(Section{kPacked, 0, offset, forms[i].size, checksum(forms[i].data, forms[i].size)});
    offset += forms[i].size;
  }
  for (const Blob& d : data) {
    check(d.size == 0 || d.data != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "a data blob is NULL");
    offset = align_up(offset, kBlobAlign);
    table.push_back(Section{kData, 0, offset, d.size, checksum(d.data, d.size)});
    offset += d.size;
  }
  for (uint32_t i = 0; i < n_ops; ++i) {
    if (originals[i].empty()) continue;
    offset = align_up(offset, kBlobAlign);
    table.push_back(Section{kOriginal, 0, offset, originals[i].size(),
                            checksum(originals[i].data(), originals[i].size())});
    offset += originals[i].size();
  }
  const size_t file_size = offset;

  std::vector<uint8_t> table_bytes(kEntrySize * table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    uint8_t* e = table_bytes.data() + i * kEntrySize;
    store(e, 0, table[i].type);
    store(e, 4, table[i].flags);
    store(e, 8, table[i].offset);
    store(e, 16, table[i].size);
    store(e, 24, table[i].checksum);
  }
  uint8_t header[kHeaderSize] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  store(header, 8, kFormatVersion);
  store(header, 12, kByteOrder);
  store<uint32_t>(header, 16, kHeaderSize);
  store<uint32_t>(header, 20, static_cast<uint32_t>(table.size()));
  store<uint64_t>(header, 24, kHeaderSize);
  store<uint64_t>(header, 32, file_size);
  store_text(header, kQpackVersion, QPACK_VERSION_STRING);
  for (const auto& bf : kBackendFields) {
    const Backend& b = backend(bf.id);
    if (!b.compiled() || b.ops.build_id == nullptr) continue;
    store_text(header, bf.build, b.ops.build_id());
    store_text(header, bf.isa, b.ops.isa());
  }
  store(header, kTableChecksum, checksum(table_bytes.data(), table_bytes.size()));
  store(header, kHeaderChecksum, checksum(header, kHeaderChecksum));

  // A temporary file beside the target, renamed over it: a process that
  // mapped the old file keeps its bytes.
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(counter.fetch_add(1));
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f.fd < 0) io_fail("could not create", tmp);
  try {
    size_t at = 0;
    const std::vector<uint8_t> zeros(kPage, 0);
    auto write_at = [&](size_t where, const void* data, size_t size) {
      while (at < where) {  // padding
        const size_t n = std::min(where - at, zeros.size());
        write_all(f.fd, zeros.data(), n, tmp);
        at += n;
      }
      write_all(f.fd, data, size, tmp);
      at += size;
    };
    write_at(0, header, kHeaderSize);
    write_at(kHeaderSize, table_bytes.data(), table_bytes.size());
    size_t s = 0;
    for (; s < small.size(); ++s) write_at(table[s].offset, small[s].data(), small[s].size());
    if (host_size > 0) write_at(table[s++].offset, host, host_size);
    for (uint32_t i = 0; i < n_ops; ++i) write_at(table[s++].offset, forms[i].data, forms[i].size);
    for (const Blob& d : data) write_at(table[s++].offset, d.data, d.size);
    for (uint32_t i = 0; i < n_ops; ++i) {
      if (!originals[i].empty()) write_at(table[s++].offset, originals[i].data(), originals[i].size());
    }
    if (::fsync(f.fd) != 0) io_fail("could not sync", tmp);
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) io_fail("could not close", tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_fail("could not rename " + tmp + " to", path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

// ---- load -----------------------------------------------------------------------

std::shared_ptr<Model> load_model(const std::string& path, const LoadOptions& options, int fd) {
  auto file = open_file(path, options.map, fd);
  const uint8_t* base = file->data;
  const size_t size = file->size;
  auto bad = [&path](auto&&... parts) {
    fail(QPACK_STATUS_FILE_FORMAT, path, ": ", parts...);
  };
  const char* refreeze = "; re-freeze the model and save it again";

  // Header.
  if (std::memcmp(base, kMagic, sizeof kMagic) != 0) bad("not a qpack model file (bad magic)");
  if (load<uint32_t>(base, 12) != kByteOrder) {
    bad("written with another byte order (qpack files are little-endian)");
  }
  const uint32_t version = load<uint32_t>(base, 8);
  if (version != kFormatVersion) {
    bad("format version ", version, "; this qpack reads version ", kFormatVersion,
        version > kFormatVersion ? " (upgrade qpack)" : refreeze);
  }
  if (load<uint32_t>(base, 16) != kHeaderSize) bad("bad header size", refreeze);
  if (load<uint64_t>(base, kHeaderChecksum) != checksum(base, kHeaderChecksum)) {
    bad("header checksum mismatch: the header is corrupt", refreeze);
  }
  const uint64_t file_size = load<uint64_t>(base, 32);
  if (file_size > size) bad("truncated: ", size, " of ", file_size, " bytes", refreeze);
  if (file_size < size) bad(size - file_size, " bytes past the end of the model", refreeze);
  const uint32_t n = load<uint32_t>(base, 20);
  if (n > kMaxSections || load<uint64_t>(base, 24) != kHeaderSize ||
      static_cast<uint64_t>(n) * kEntrySize > size - kHeaderSize) {
    bad("bad section table bounds", refreeze);
  }
  const uint8_t* tb = base + kHeaderSize;
  if (load<uint64_t>(base, kTableChecksum) != checksum(tb, n * kEntrySize)) {
    bad("section table checksum mismatch: the table is corrupt", refreeze);
  }
  const size_t table_end = kHeaderSize + n * kEntrySize;
  std::vector<Section> table(n);
  size_t hosts = 0;
  for (uint32_t i = 0; i < n; ++i) {
    Section& s = table[i];
    const uint8_t* e = tb + i * kEntrySize;
    s.type = load<uint32_t>(e, 0);
    s.flags = load<uint32_t>(e, 4);
    s.offset = load<uint64_t>(e, 8);
    s.size = load<uint64_t>(e, 16);
    s.checksum = load<uint64_t>(e, 24);
    if (s.type < kOp || s.type > kData || s.flags != 0) bad("section ", i, " has an unknown type", refreeze);
    if (s.offset < table_end || s.offset > size || s.size > size - s.offset) {
      bad("section ", i, " lies outside the file (offset ", s.offset, ", size ", s.size, ")", refreeze);
    }
    if ((s.type == kPacked || s.type == kOriginal || s.type == kData) && s.offset % kBlobAlign != 0) {
      bad("section ", i, " is not 64-byte aligned", refreeze);
    }
    if (s.type == kHost && ++hosts > 1) bad("more than one host section", refreeze);
    if (options.verify && checksum(base + s.offset, s.size) != s.checksum) {
      static const char* names[] = {"",      "op",   "packed weights", "original weights",
                                    "graph", "host", "data"};
      bad("checksum mismatch in section ", i, " (", names[s.type], ", ", s.size,
          " bytes at offset ", s.offset, "): the file is corrupt", refreeze);
    }
  }

  // Builds and ISAs: this build's packing code, or another's (then nothing is
  // used in place); another ISA only names itself in messages, the layouts
  // decide (QNNPACK packs the same bytes on x86 and ARM for equal blocking).
  std::string other[QPACK_BACKEND_QNNPACK + 1];
  bool same_build[QPACK_BACKEND_QNNPACK + 1] = {true, true, true};
  for (const auto& bf : kBackendFields) {
    const Backend& b = backend(bf.id);
    const std::string build = load_text(base, bf.build), isa = load_text(base, bf.isa);
    if (!b.compiled() || b.ops.build_id == nullptr || build.empty()) continue;
    const std::string here = b.ops.build_id(), here_isa = b.ops.isa();
    same_build[bf.id] = build == here;
    if (build != here || isa != here_isa) {
      other[bf.id] = std::string("packed by '") + build + "' for " + isa + "; this is '" + here +
                     "' on " + here_isa;
    }
  }

  auto model = std::make_shared<Model>();
  model->file_size = size;
  model->mapped = file->mapped;
  auto blob = [&](const Section& s) {
    return Blob{file, base + s.offset, static_cast<size_t>(s.size)};
  };
  for (uint32_t i = 0; i < n; ++i) {
    const Section& s = table[i];
    if (s.type == kHost) model->host = blob(s);
    if (s.type == kData) {
      model->data.push_back(blob(s));
      model->data_offsets.push_back(s.offset);
    }
    if (s.type != kOp) continue;
    const size_t op_index = model->ops.size();
    const std::string what = "op " + std::to_string(op_index);
    ByteReader r(base + s.offset, s.size, path + ": " + what);
    const uint32_t kind = r.get<uint32_t>();
    r.expect(kind <= 1, "op kind");
    SavedCommon c;
    const uint32_t backend_id = r.get<uint32_t>(), mode = r.get<uint32_t>();
    r.expect(backend_id == QPACK_BACKEND_ONEDNN || backend_id == QPACK_BACKEND_QNNPACK, "backend");
    r.expect(mode <= QPACK_MODE_INT8_DYNAMIC, "mode");
    c.backend = static_cast<qpack_backend>(backend_id);
    c.mode = static_cast<qpack_mode>(mode);
    const uint32_t packed_section = r.get<uint32_t>();
    const int32_t original_section = r.get<int32_t>();
    r.expect(packed_section < n && table[packed_section].type == kPacked, "packed section index");
    r.expect(original_section == -1 ||
                 (original_section >= 0 && static_cast<uint32_t>(original_section) < n &&
                  table[original_section].type == kOriginal),
             "original section index");
    const auto geometry = r.get_vec<int64_t>(13, "geometry");
    r.expect(geometry.size() == (kind == 0 ? 2u : 13u), "geometry");
    c.weight_scales = r.get_vec<float>(kMaxChannels, "weight scale count");
    r.expect(c.weight_scales.size() <= r.remaining() / sizeof(int32_t), "weight zero points");
    c.weight_zero_points.resize(c.weight_scales.size());
    if (!c.weight_scales.empty()) {
      std::memcpy(c.weight_zero_points.data(), r.take(c.weight_scales.size() * 4),
                  c.weight_scales.size() * 4);
    }
    c.bias = r.get_vec<float>(kMaxChannels, "bias count");
    r.expect(c.bias.empty() || static_cast<int64_t>(c.bias.size()) == geometry[1], "bias count");
    c.clamp_min = r.get<float>();
    c.clamp_max = r.get<float>();
    c.input_scale = r.get<float>();
    c.input_zero_point = r.get<int32_t>();
    c.output_scale = r.get<float>();
    c.output_zero_point = r.get<int32_t>();
    SavedForm form;
    form.layout = r.get_vec<uint8_t>(4096, "layout size");
    r.expect(r.remaining() == 0, "length");
    form.packed = blob(table[packed_section]);
    form.allow_repack = !options.strict;
    form.same_build = same_build[c.backend];
    form.other_build = other[c.backend];
    form.what = path + ": " + what + " (" + (kind == 0 ? "linear" : "conv2d") + ")";
    const Blob original = original_section >= 0 ? blob(table[original_section]) : Blob{};

    // The spec, validated as the create calls validate their parameters.
    try {
      if (kind == 0) {
        qpack_linear_params p;
        qpack_linear_params_init(&p);
        p.in_features = geometry[0];
        p.out_features = geometry[1];
        c.fill(&p);
        LinearSpec spec = make_linear_spec(p, false);
        r.expect(original.size == 0 || original.size == spec.weight_nbytes(), "original size");
        model->ops.push_back(ModelOp{std::make_shared<Linear>(std::move(spec), form, original), nullptr});
      } else {
        qpack_conv2d_params p;
        qpack_conv2d_params_init(&p);
        int64_t* g[13] = {&p.in_channels, &p.out_channels, &p.groups,     &p.kernel_h,
                          &p.kernel_w,    &p.stride_h,     &p.stride_w,   &p.pad_top,
                          &p.pad_left,    &p.pad_bottom,   &p.pad_right,  &p.dilation_h,
                          &p.dilation_w};
        for (int k = 0; k < 13; ++k) *g[k] = geometry[k];
        c.fill(&p);
        ConvSpec spec = make_conv_spec(p, false);
        r.expect(original.size == 0 || original.size == spec.weight_nbytes(), "original size");
        model->ops.push_back(ModelOp{nullptr, std::make_shared<Conv>(std::move(spec), form, original)});
      }
    } catch (const Error& e) {
      if (e.status() == QPACK_STATUS_INVALID_ARGUMENT || e.status() == QPACK_STATUS_INVALID_TYPE) {
        bad(what, " has invalid parameters (", e.what(), ")", refreeze);
      }
      if (e.status() == QPACK_STATUS_UNSUPPORTED) {
        bad(what, " cannot be loaded by this build (", e.what(), ")");
      }
      throw;
    }
    if (form.repacked) {
      model->repacked.push_back(what + " (" + node_op_name(model->ops.back()) + ") re-packed: " + form.why);
    } else {
      model->nbytes_in_place += form.packed.size;
    }
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (table[i].type != kGraph) continue;
    const std::string what = "graph " + std::to_string(model->graphs.size());
    ByteReader r(base + table[i].offset, table[i].size, path + ": " + what);
    try {
      model->graphs.push_back(read_graph(r, model->ops));
    } catch (const Error& e) {
      if (e.status() == QPACK_STATUS_INVALID_ARGUMENT || e.status() == QPACK_STATUS_INVALID_TYPE) {
        bad(what, " is not a valid graph (", e.what(), ")", refreeze);
      }
      throw;
    }
  }
  return model;
}

}  // namespace qpack
