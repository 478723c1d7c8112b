"""A pure-Python reader of ``.qpk`` model files (docs/FORMAT.md), for
``qpack inspect`` and ``qpack verify``.

It reads the header, the section table, the OP records (with their oneDNN and
QNNPACK layout blobs) and the GRAPH records again, independently of the core,
and checks every field it can check without running a kernel. Checksums are
XXH3-64 (seed 0) from PyPI's ``xxhash``, the same function the core computes
with ``libxxhash``. The file may be truncated or corrupt in any byte: every
offset, size and count is checked before use, and every failed check becomes
a line in ``problems`` instead of an exception. Only I/O errors (a missing or
unreadable file) raise.

Imports neither torch nor the extension.
"""
import math
import os
import struct

MAGIC = b"\x89QPK\r\n\x1a\n"
FORMAT_VERSION = 1
BYTE_ORDER = 0x01020304
HEADER_SIZE = 256
ENTRY_SIZE = 32
MAX_SECTIONS = 1 << 20
PAGE = 4096
WEIGHT_ALIGN = 64
SMALL_ALIGN = 8

SECTION_TYPES = {1: "op", 2: "packed", 3: "original", 4: "graph", 5: "host", 6: "data"}
WEIGHT_SEGMENT = (2, 3, 6)  # PACKED, ORIGINAL, DATA: 64-byte aligned, after the page boundary
OPS = {0: "linear", 1: "conv2d"}
BACKENDS = {1: "onednn", 2: "qnnpack"}              # qpack_backend
MODES = {0: "f32", 1: "int8_static", 2: "int8_dynamic"}  # qpack_mode, named as PackedLinear.mode
DTYPES = {0: "f32", 1: "u8"}                        # qpack_dtype
NODE_KINDS = {                                      # qpack_node_kind (src/include/qpack/qpack.h)
    0: "conv2d", 1: "linear", 2: "add", 3: "maxpool2d", 4: "avgpool2d", 5: "global_avgpool",
    6: "flatten", 7: "concat", 8: "activation", 9: "affine", 10: "quantize", 11: "dequantize",
    12: "mul",
    13: "channels",
    14: "adaptive_avgpool2d",
    15: "prelu", 16: "resize_nearest", 17: "resize_bilinear",
    18: "channel_range", 19: "layer_norm", 20: "transpose", 21: "depth_to_space", 22: "attention",
    23: "constant", 24: "pad", 25: "permute_rows",
}
ACTIVATIONS = {                                     # qpack_activation
    0: "none", 1: "relu", 2: "clamp", 3: "hardswish", 4: "sigmoid", 5: "gelu", 6: "silu",
    7: "hardsigmoid", 8: "leaky_relu", 9: "tanh",
}
MAX_NODE_INPUTS = 8                                 # qpack_graph_node.inputs[8]
LINEAR_GEOMETRY = ("K", "N")
CONV_GEOMETRY = ("IC", "OC", "groups", "KH", "KW", "stride_h", "stride_w", "pad_top", "pad_left",
                 "pad_bottom", "pad_right", "dilation_h", "dilation_w")

ONEDNN_TAG = 0x4C4E4E44      # "DNNL"
QNNPACK_TAG = 0x504E4E51     # "QNNP"
ONEDNN_DATA_TYPES = {3: "f32", 5: "s8"}  # dnnl_data_type_t values the format uses
ONEDNN_ELEMENT_BYTES = {3: 4, 5: 1}
ONEDNN_MAX_NDIMS = 12                    # DNNL_MAX_NDIMS
QNNPACK_KINDS = {0: "q8gemm", 1: "dwconv", 2: "gemm_1x1", 3: "conv"}

_CHUNK = 1 << 20
# the smallest GRAPH node record (no inputs, no affine): kind, num_in, out, op, 8 x i64
# pooling fields, 4 flag bytes, activation, act_min, act_max, num_affine
_MIN_NODE = 4 * 4 + 8 * 8 + 4 + 4 + 8 + 4


class _Short(Exception):
    """A record ended before a field it declares (caught per record)."""


class _Cursor:
    """Little-endian fields read in order from one record's bytes; never reads past its end."""

    def __init__(self, data):
        self.data = data
        self.pos = 0

    @property
    def left(self):
        return len(self.data) - self.pos

    def _take(self, fmt, size, field):
        if size > self.left:
            raise _Short(f"{field} needs {size} bytes at byte {self.pos}, the record has {self.left} left")
        v = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return v

    def u32(self, field):
        return self._take("<I", 4, field)[0]

    def i32(self, field):
        return self._take("<i", 4, field)[0]

    def i64(self, field):
        return self._take("<q", 8, field)[0]

    def u64(self, field):
        return self._take("<Q", 8, field)[0]

    def f32(self, field):
        return self._take("<f", 4, field)[0]

    def array(self, code, count, field):
        size = struct.calcsize(code)
        if count * size > self.left:  # checked before anything of that size is built
            raise _Short(f"{field}: {count} x {size} bytes at byte {self.pos}, the record has {self.left} left")
        return list(self._take(f"<{count}{code}", count * size, field))

    def raw(self, count, field):
        if count > self.left:
            raise _Short(f"{field}: {count} bytes at byte {self.pos}, the record has {self.left} left")
        out = self.data[self.pos:self.pos + count]
        self.pos += count
        return out


def _cstr(raw):
    """A NUL-padded text field (bytes after the first NUL ignored)."""
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _finite(x):
    return not (math.isnan(x) or math.isinf(x))


def _xxh3(data):
    import xxhash  # a run-time dependency; imported on use so `import qpack` stays light
    return xxhash.xxh3_64_intdigest(data)


def _xxh3_file(f, offset, size):
    import xxhash
    h = xxhash.xxh3_64()
    f.seek(offset)
    left = size
    while left:
        chunk = f.read(min(left, _CHUNK))
        if not chunk:
            return None  # the file shrank under us
        h.update(chunk)
        left -= len(chunk)
    return h.intdigest()


def _read_at(f, offset, size):
    f.seek(offset)
    return f.read(size)


# ---- header and table ----------------------------------------------------------------

def _header(raw, real_size, problems):
    """Header fields of the first 256 bytes; False when nothing after it can be trusted."""
    h = {}
    magic = raw[0:8]
    h["magic_ok"] = magic == MAGIC
    if not h["magic_ok"]:
        problems.append(f"magic: not a .qpk file (starts with {magic.hex(' ')}, a .qpk file with "
                        f"{MAGIC.hex(' ')})")
        return h, False
    (h["format_version"], h["byte_order"], h["header_size"], h["num_sections"], h["table_offset"],
     h["file_size"]) = struct.unpack_from("<IIIIQQ", raw, 8)
    h["qpack_version"] = _cstr(raw[40:56])
    h["onednn_build"] = _cstr(raw[56:120])
    h["qnnpack_build"] = _cstr(raw[120:184])
    h["onednn_isa"] = _cstr(raw[184:216])
    h["qnnpack_isa"] = _cstr(raw[216:232])
    h["table_checksum"], h["reserved"], h["header_checksum"] = struct.unpack_from("<QQQ", raw, 232)
    computed = _xxh3(raw[:248])
    h["header_checksum_ok"] = computed == h["header_checksum"]
    trusted = True
    if h["byte_order"] != BYTE_ORDER:
        if h["byte_order"] == 0x04030201:
            problems.append("byte_order: written big-endian (0x04030201); .qpk files are little-endian")
            trusted = False
        else:
            problems.append(f"byte_order: 0x{h['byte_order']:08x}, expected 0x{BYTE_ORDER:08x}")
    if not h["header_checksum_ok"]:
        problems.append(f"header_checksum: stored 0x{h['header_checksum']:016x}, the header's bytes "
                        f"[0, 248) give 0x{computed:016x} (the header is corrupt)")
    if h["format_version"] != FORMAT_VERSION:
        problems.append(f"format_version: {h['format_version']}, this reader knows version "
                        f"{FORMAT_VERSION}; update qpack to read it")
        trusted = False
    if h["header_size"] != HEADER_SIZE:
        problems.append(f"header_size: {h['header_size']}, expected {HEADER_SIZE}")
    if h["file_size"] != real_size:
        if real_size < h["file_size"]:
            problems.append(f"file_size: the header says {h['file_size']} bytes, the file has {real_size} "
                            "(truncated)")
        else:
            problems.append(f"file_size: the header says {h['file_size']} bytes, the file has {real_size} "
                            f"({real_size - h['file_size']} trailing bytes)")
    if h["reserved"] != 0:
        problems.append(f"reserved: {h['reserved']}, expected 0")
    return h, trusted


def _table(f, h, real_size, problems):
    """The section table's bytes, or None when it cannot be read."""
    n, off = h["num_sections"], h["table_offset"]
    if n > MAX_SECTIONS:
        problems.append(f"num_sections: {n}, more than the format's limit {MAX_SECTIONS}")
        return None
    if off != HEADER_SIZE:
        problems.append(f"table_offset: {off}, expected {HEADER_SIZE}")
        if off < HEADER_SIZE:
            return None
    end = off + n * ENTRY_SIZE
    if end > real_size:
        problems.append(f"section table: {n} entries end at byte {end}, past the end of the "
                        f"{real_size}-byte file")
        return None
    raw = _read_at(f, off, n * ENTRY_SIZE)
    computed = _xxh3(raw)
    h["table_checksum_ok"] = computed == h["table_checksum"]
    if not h["table_checksum_ok"]:
        problems.append(f"table_checksum: stored 0x{h['table_checksum']:016x}, the table's bytes give "
                        f"0x{computed:016x} (the section table is corrupt)")
    return raw


def _sections(f, table_raw, table_end, real_size, verify, problems):
    sections = []
    for i in range(len(table_raw) // ENTRY_SIZE):
        t, flags, off, size, checksum = struct.unpack_from("<IIQQQ", table_raw, i * ENTRY_SIZE)
        s = {"index": i, "type": SECTION_TYPES.get(t, f"unknown({t})"), "type_id": t, "flags": flags,
             "offset": off, "size": size, "checksum": checksum, "ok": None, "in_bounds": True}
        where = f"section {i} ({s['type']})"
        if t not in SECTION_TYPES:
            problems.append(f"{where}: unknown type {t} (1 op, 2 packed, 3 original, 4 graph, 5 host, 6 data)")
        if flags != 0:
            problems.append(f"{where}: flags {flags}, expected 0")
        if off < table_end or off + size > real_size:
            s["in_bounds"] = False
            problems.append(f"{where}: bytes [{off}, {off + size}) are not inside the file after the table "
                            f"([{table_end}, {real_size}))")
        elif t in WEIGHT_SEGMENT and off % WEIGHT_ALIGN:
            problems.append(f"{where}: offset {off} is not a multiple of {WEIGHT_ALIGN}")
        elif t in (1, 4, 5) and off % SMALL_ALIGN:
            problems.append(f"{where}: offset {off} is not a multiple of {SMALL_ALIGN}")
        if verify:
            if not s["in_bounds"]:
                s["ok"] = False
            else:
                computed = _xxh3_file(f, off, size)
                s["ok"] = computed == checksum
                if not s["ok"]:
                    got = "unreadable" if computed is None else f"0x{computed:016x}"
                    problems.append(f"{where}: checksum mismatch: stored 0x{checksum:016x}, its bytes give "
                                    f"{got} (the section is corrupt)")
        sections.append(s)
    hosts = [s["index"] for s in sections if s["type_id"] == 5]
    if len(hosts) > 1:
        problems.append(f"host: {len(hosts)} HOST sections ({hosts}); a file has at most one")
    spans = sorted((s["offset"], s["offset"] + s["size"], s["index"]) for s in sections
                   if s["in_bounds"] and s["size"])
    for (a0, a1, ai), (b0, b1, bi) in zip(spans, spans[1:]):
        if b0 < a1:
            problems.append(f"sections {ai} and {bi} overlap ([{a0}, {a1}) and [{b0}, {b1}))")
    return sections


# ---- OP records ----------------------------------------------------------------------

def _layout_head(c, tag, lib, problems, where):
    """The layout's version field; None (with a problem) for a version this reader does not know."""
    version = c.u32("layout version")
    if version != 1:
        problems.append(f"{where}: {lib} layout version {version}, this reader knows 1")
        return None
    return {"tag": tag, "version": version}


def _onednn_layout(c, problems, where):
    lay = _layout_head(c, "onednn", "oneDNN", problems, where)
    if lay is None:
        return {"tag": "onednn"}, False
    dt = c.u32("layout data_type")
    lay["data_type_id"] = dt
    lay["data_type"] = ONEDNN_DATA_TYPES.get(dt, f"unknown({dt})")
    lay["split"] = c.u32("layout split")
    ndims = c.i32("layout ndims")
    lay["ndims"] = ndims
    if not 1 <= ndims <= ONEDNN_MAX_NDIMS:
        problems.append(f"{where}: oneDNN layout ndims {ndims} outside [1, {ONEDNN_MAX_NDIMS}]")
        return lay, False
    lay["dims"] = c.array("q", ndims, "layout dims")
    lay["strides"] = c.array("q", ndims, "layout strides")
    nblks = c.i32("layout inner_nblks")
    if not 0 <= nblks <= ONEDNN_MAX_NDIMS:
        problems.append(f"{where}: oneDNN layout inner_nblks {nblks} outside [0, {ONEDNN_MAX_NDIMS}]")
        return lay, False
    lay["inner_blks"] = c.array("q", nblks, "layout inner_blks")
    lay["inner_idxs"] = c.array("q", nblks, "layout inner_idxs")
    lay["size"] = c.u64("layout size")
    lay["problem"] = c.array("q", 3, "layout problem")  # conv: channels-last N, H, W; linear: batch, 0, 0
    lay["summary"] = _onednn_tag(lay)
    return lay, True


def _onednn_tag(lay):
    """oneDNN's own spelling of a blocked layout, e.g. ``BA16a64b4a`` (outer dims by
    decreasing stride, capitals for blocked dims; then the inner blocks)."""
    nd = lay["ndims"]
    letters = "abcdefghijkl"[:nd]
    if not all(0 <= i < nd for i in lay["inner_idxs"]):
        return "?"
    blocked = set(lay["inner_idxs"])
    order = sorted(range(nd), key=lambda d: (-lay["strides"][d], d))
    outer = "".join(letters[d].upper() if d in blocked else letters[d] for d in order)
    inner = "".join(f"{b}{letters[i]}" for b, i in zip(lay["inner_blks"], lay["inner_idxs"]))
    return outer + inner


def _check_onednn(lay, op, problems, where):
    """The layout against the op it packs and against its own size."""
    dt, nd = lay["data_type_id"], lay["ndims"]
    want_dt = 3 if op.get("mode") == "f32" else 5
    if dt not in ONEDNN_DATA_TYPES:
        problems.append(f"{where}: oneDNN data_type {dt} is neither f32 (3) nor s8 (5)")
    elif op.get("mode") in MODES.values() and dt != want_dt:
        problems.append(f"{where}: oneDNN data_type {lay['data_type']} does not match mode {op['mode']}")
    if lay["split"] not in (0, 1):
        problems.append(f"{where}: oneDNN split {lay['split']}, expected 0 or 1")
    elif lay["split"] and dt != 5:
        problems.append(f"{where}: oneDNN split layout for a {lay['data_type']} weight (int8 only)")
    g = op.get("geometry") or {}
    expected = None
    if op.get("op") == "linear" and len(g) == 2:
        expected = {2: [g["K"], g["N"]]}
        what = "2 (the matmul's B [K, N])"
    elif op.get("op") == "conv2d" and len(g) == 13 and g["groups"] > 0:
        gr = g["groups"]
        expected = {4: [g["OC"], g["IC"], g["KH"], g["KW"]],
                    5: [gr, g["OC"] // gr, g["IC"] // gr, g["KH"], g["KW"]]}
        if gr != 1:
            del expected[4]
        what = "4 (oihw)" if gr == 1 else "5 (goihw)"
    if expected is not None:
        if nd not in expected:
            problems.append(f"{where}: oneDNN ndims {nd}, expected {what}")
        elif lay["dims"] != expected[nd]:
            problems.append(f"{where}: oneDNN dims {lay['dims']} do not match the op's geometry "
                            f"{expected[nd]}")
    if any(d <= 0 for d in lay["dims"]):
        problems.append(f"{where}: oneDNN dims {lay['dims']} must be positive")
        return
    if any(s < 0 for s in lay["strides"]):
        problems.append(f"{where}: oneDNN strides {lay['strides']} must not be negative")
        return
    if any(not 0 <= i < nd for i in lay["inner_idxs"]) or any(b <= 0 for b in lay["inner_blks"]):
        problems.append(f"{where}: oneDNN inner blocks {lay['inner_blks']} over dims {lay['inner_idxs']} "
                        f"are not positive blocks of dims 0..{nd - 1}")
        return
    if any(p < 0 for p in lay["problem"]):
        problems.append(f"{where}: oneDNN problem shape {lay['problem']} has a negative dim")
    if lay["size"] != op.get("packed_bytes"):
        problems.append(f"{where}: oneDNN layout size {lay['size']} differs from its PACKED section's "
                        f"{op.get('packed_bytes')} bytes")
    # Every element the blocking addresses must lie inside the packed memory.
    block = [1] * nd
    for b, i in zip(lay["inner_blks"], lay["inner_idxs"]):
        block[i] *= b
    inner = 1
    for b in lay["inner_blks"]:
        inner *= b
    last = inner - 1 + sum((-(-lay["dims"][d] // block[d]) - 1) * lay["strides"][d] for d in range(nd))
    nbytes = (last + 1) * ONEDNN_ELEMENT_BYTES.get(dt, 1)
    if nbytes > lay["size"]:
        problems.append(f"{where}: oneDNN blocking {lay['summary']} addresses {nbytes} bytes, more than "
                        f"its size {lay['size']}")


def _qnnpack_layout(c, problems, where):
    lay = _layout_head(c, "qnnpack", "QNNPACK", problems, where)
    if lay is None:
        return {"tag": "qnnpack"}, False
    k = c.u32("layout kind")
    lay["kind_id"] = k
    lay["kind"] = QNNPACK_KINDS.get(k, f"unknown({k})")
    lay["nr"], lay["kr"], lay["cr"] = c.u32("layout nr"), c.u32("layout kr"), c.u32("layout cr")
    lay["packed_size"] = c.u64("layout packed_size")
    lay["bias_input_scale"] = c.f32("layout bias_input_scale")
    blk = f"cr={lay['cr']}" if k == 1 else f"nr={lay['nr']} kr={lay['kr']}"
    lay["summary"] = f"{lay['kind']} {blk}"
    return lay, True


def _check_qnnpack(lay, op, problems, where):
    k = lay["kind_id"]
    if k not in QNNPACK_KINDS:
        problems.append(f"{where}: QNNPACK kind {k} unknown (0 q8gemm, 1 dwconv, 2 gemm_1x1, 3 conv)")
    elif op.get("op") == "linear" and k != 0:
        problems.append(f"{where}: QNNPACK kind {lay['kind']} for a linear op (q8gemm expected)")
    elif op.get("op") == "conv2d" and k == 0:
        problems.append(f"{where}: QNNPACK kind q8gemm for a conv2d op")
    if k == 1:
        if lay["cr"] == 0:
            problems.append(f"{where}: QNNPACK dwconv with cr 0")
    elif k in QNNPACK_KINDS and (lay["nr"] == 0 or lay["kr"] == 0):
        problems.append(f"{where}: QNNPACK blocking nr={lay['nr']} kr={lay['kr']} must be positive")
    if lay["packed_size"] != op.get("packed_bytes"):
        problems.append(f"{where}: QNNPACK packed_size {lay['packed_size']} differs from its PACKED "
                        f"section's {op.get('packed_bytes')} bytes")
    s = lay["bias_input_scale"]
    if not (_finite(s) and s >= 0):
        problems.append(f"{where}: QNNPACK bias_input_scale {s} must be finite and >= 0")
    if op.get("mode") == "f32":
        problems.append(f"{where}: QNNPACK packs int8 ops only, this one is f32")


def _section_ref(sections, idx, want_type, field, where, problems):
    """The section an op refers to, or None (with a problem) when the reference is bad."""
    if not 0 <= idx < len(sections):
        problems.append(f"{where}: {field} {idx} is not a section of this file (0..{len(sections) - 1})")
        return None
    s = sections[idx]
    if s["type_id"] != want_type:
        problems.append(f"{where}: {field} {idx} is a section of type {s['type']}, not {SECTION_TYPES[want_type]}")
        return None
    return s


def _new_op(index, section):
    return {"index": index, "section": section["index"], "op": None, "backend": None, "mode": None,
            "geometry": {}, "num_weight_scales": 0, "has_bias": False, "packed_bytes": 0,
            "original_bytes": 0, "layout": {}}


def _op_fields(c, op, sections, problems, where):
    op_id, be, mode = c.u32("op"), c.u32("backend"), c.u32("mode")
    op["op"] = OPS.get(op_id, f"unknown({op_id})")
    op["backend"] = BACKENDS.get(be, f"unknown({be})")
    op["mode"] = MODES.get(mode, f"unknown({mode})")
    if op_id not in OPS:
        problems.append(f"{where}: op {op_id} unknown (0 linear, 1 conv2d)")
    if be not in BACKENDS:
        problems.append(f"{where}: backend {be} unknown (1 onednn, 2 qnnpack)")
    if mode not in MODES:
        problems.append(f"{where}: mode {mode} unknown (0 f32, 1 int8_static, 2 int8_dynamic)")
    packed_idx, orig_idx = c.u32("packed_section"), c.i32("original_section")
    op["packed_section"], op["original_section"] = packed_idx, orig_idx
    packed = _section_ref(sections, packed_idx, 2, "packed_section", where, problems)
    if packed is not None:
        op["packed_bytes"] = packed["size"]
    original = None
    if orig_idx != -1:
        original = _section_ref(sections, orig_idx, 3, "original_section", where, problems)
        if original is not None:
            op["original_bytes"] = original["size"]

    n_geo = c.u32("num_geometry")
    names = {0: LINEAR_GEOMETRY, 1: CONV_GEOMETRY}.get(op_id)
    if names is not None and n_geo != len(names):
        problems.append(f"{where}: num_geometry {n_geo}, a {op['op']} has {len(names)}")
    geo = c.array("q", n_geo, "geometry")
    if names is not None and len(geo) == len(names):
        op["geometry"] = dict(zip(names, geo))
        _check_geometry(op, problems, where)
    else:
        op["geometry"] = {f"g{i}": v for i, v in enumerate(geo)}
    channels = _out_channels(op)

    nws = c.u32("num_weight_scales")
    op["num_weight_scales"] = nws
    scales = c.array("f", nws, "weight_scales")
    zps = c.array("i", nws, "weight_zero_points")
    if mode == 0 and nws:
        problems.append(f"{where}: an f32 op with {nws} weight scales (0 expected)")
    elif mode in (1, 2) and nws != 1 and nws != channels:
        problems.append(f"{where}: {nws} weight scales, expected 1 or one per output channel ({channels})")
    if not all(_finite(s) and s > 0 for s in scales):
        problems.append(f"{where}: weight scales must be finite and positive")
    if any(not -128 <= z <= 127 for z in zps):
        problems.append(f"{where}: weight zero points outside the int8 range [-128, 127]")
    elif be != 2 and any(zps):
        problems.append(f"{where}: weight zero points must be 0 on {op['backend']} (symmetric int8 weights; "
                        "only QNNPACK takes asymmetric ones)")
    if scales:
        op["weight_scale_range"] = (min(scales), max(scales))

    nb = c.u32("num_bias")
    bias = c.array("f", nb, "bias")
    op["has_bias"] = nb > 0
    if not all(_finite(b) for b in bias):
        problems.append(f"{where}: bias holds NaN or infinity")
    if nb and nb != channels:
        problems.append(f"{where}: {nb} bias values, expected one per output channel ({channels})")

    op["clamp"] = (c.f32("clamp_min"), c.f32("clamp_max"))
    if not op["clamp"][0] < op["clamp"][1]:
        problems.append(f"{where}: clamp [{op['clamp'][0]}, {op['clamp'][1]}] is empty")
    op["input_scale"], op["input_zero_point"] = c.f32("input_scale"), c.i32("input_zero_point")
    op["output_scale"], op["output_zero_point"] = c.f32("output_scale"), c.i32("output_zero_point")
    if mode == 1:
        s = op["input_scale"]
        if not (_finite(s) and s >= 0):
            problems.append(f"{where}: input_scale {s} must be finite and >= 0 (0: given per call)")
        if s and not 0 <= op["input_zero_point"] <= 255:
            problems.append(f"{where}: input_zero_point {op['input_zero_point']} outside [0, 255]")
        if not (_finite(op["output_scale"]) and op["output_scale"] > 0):
            problems.append(f"{where}: output_scale {op['output_scale']} must be finite and positive")
        if not 0 <= op["output_zero_point"] <= 255:
            problems.append(f"{where}: output_zero_point {op['output_zero_point']} outside [0, 255]")

    if original is not None and channels:
        want = _original_bytes(op)
        if want is not None and original["size"] != want:
            problems.append(f"{where}: ORIGINAL section {orig_idx} has {original['size']} bytes, the "
                            f"{op['mode']} weight has {want}")

    layout_size = c.u32("layout_size")
    lc = _Cursor(c.raw(layout_size, "layout"))
    lwhere = f"{where} layout"
    try:
        tag = lc.u32("layout tag")
        if tag == ONEDNN_TAG:
            lay, full = _onednn_layout(lc, problems, lwhere)
            if full:
                _check_onednn(lay, op, problems, lwhere)
        elif tag == QNNPACK_TAG:
            lay, full = _qnnpack_layout(lc, problems, lwhere)
            if full:
                _check_qnnpack(lay, op, problems, lwhere)
        else:
            lay, full = {"tag": f"unknown(0x{tag:08x})"}, False
            problems.append(f"{lwhere}: tag 0x{tag:08x} is neither DNNL (0x{ONEDNN_TAG:08x}) nor "
                            f"QNNP (0x{QNNPACK_TAG:08x})")
        op["layout"] = lay
        want = {"onednn": 1, "qnnpack": 2}.get(lay["tag"])
        if want is not None and be in BACKENDS and want != be:
            problems.append(f"{lwhere}: a {lay['tag']} layout for an op on {op['backend']}")
        if full and lc.left:
            problems.append(f"{lwhere}: {lc.left} bytes after the layout's last field")
    except _Short as e:
        problems.append(f"{lwhere}: truncated: {e}")
    if c.left:
        problems.append(f"{where}: {c.left} bytes after the record's last field")


def _check_geometry(op, problems, where):
    g = op["geometry"]
    if op["op"] == "linear":
        if g["K"] < 1 or g["N"] < 1:
            problems.append(f"{where}: linear K={g['K']} N={g['N']} must be >= 1")
        return
    bad = [k for k in ("IC", "OC", "groups", "KH", "KW", "stride_h", "stride_w", "dilation_h", "dilation_w")
           if g[k] < 1]
    bad += [k for k in ("pad_top", "pad_left", "pad_bottom", "pad_right") if g[k] < 0]
    if bad:
        problems.append(f"{where}: conv2d geometry out of range: " + ", ".join(f"{k}={g[k]}" for k in bad)
                        + " (sizes, strides and dilations must be >= 1, pads >= 0)")
    elif g["IC"] % g["groups"] or g["OC"] % g["groups"]:
        problems.append(f"{where}: conv2d IC={g['IC']} and OC={g['OC']} must be divisible by "
                        f"groups={g['groups']}")


def _out_channels(op):
    g = op["geometry"]
    if op["op"] == "linear" and "N" in g:
        return g["N"]
    if op["op"] == "conv2d" and "OC" in g:
        return g["OC"]
    return 0


def _original_bytes(op):
    g, elem = op["geometry"], 4 if op["mode"] == "f32" else 1
    if op["op"] == "linear":
        return g["N"] * g["K"] * elem
    if op["op"] == "conv2d" and g["groups"] > 0:
        return g["OC"] * (g["IC"] // g["groups"]) * g["KH"] * g["KW"] * elem
    return None


# ---- GRAPH records -------------------------------------------------------------------

def _new_graph(index, section):
    return {"index": index, "section": section["index"], "values": [], "inputs": [], "outputs": [], "nodes": []}


def _record(entry, data, read_fields, context, problems, where):
    """Fills ``entry`` from one record's bytes (None: the section lies outside the file)."""
    if data is None:
        entry["error"] = "section outside the file"
        return entry
    try:
        read_fields(_Cursor(data), entry, context, problems, where)
    except _Short as e:
        problems.append(f"{where}: record truncated: {e}")
        entry["error"] = str(e)
    return entry


def _graph_fields(c, g, ops, problems, where):
    nv = c.u32("num_values")
    if nv == 0:
        problems.append(f"{where}: a graph without values")
    if nv * 12 > c.left:
        raise _Short(f"num_values {nv} needs {nv * 12} bytes, the record has {c.left} left")
    for v in range(nv):
        dt, scale, zp = c.u32("value dtype"), c.f32("value scale"), c.i32("value zero_point")
        g["values"].append({"index": v, "dtype": DTYPES.get(dt, f"unknown({dt})"), "scale": scale,
                            "zero_point": zp})
        if dt not in DTYPES:
            problems.append(f"{where}: value {v} has unknown dtype {dt} (0 f32, 1 u8)")
        elif dt == 1 and not (_finite(scale) and scale > 0 and 0 <= zp <= 255):
            problems.append(f"{where}: u8 value {v} has scale {scale}, zero point {zp} "
                            "(a positive finite scale and a zero point in [0, 255] expected)")

    def index_list(field):
        n = c.u32(f"num_{field}")
        return c.array("i", n, field)

    g["inputs"] = index_list("inputs")
    g["outputs"] = index_list("outputs")
    for field in ("inputs", "outputs"):
        bad = [v for v in g[field] if not 0 <= v < nv]
        if bad:
            problems.append(f"{where}: {field} {bad} are not values (0..{nv - 1})")

    n_nodes = c.u32("num_nodes")
    if n_nodes * _MIN_NODE > c.left:
        raise _Short(f"num_nodes {n_nodes} needs at least {n_nodes * _MIN_NODE} bytes, the record has "
                     f"{c.left} left")
    produced = set(v for v in g["inputs"] if 0 <= v < nv)
    for k in range(n_nodes):
        node = _node(c, k, nv, ops, problems, f"{where} node {k}")
        g["nodes"].append(node)
        for v in node["inputs"]:
            if 0 <= v < nv and v not in produced:
                problems.append(f"{where} node {k} ({node['kind']}): input value {v} is used before it is "
                                "produced")
        out = node["output"]
        if 0 <= out < nv:
            if out in produced:
                problems.append(f"{where} node {k} ({node['kind']}): value {out} is produced twice")
            produced.add(out)
    missing = [v for v in g["outputs"] if 0 <= v < nv and v not in produced]
    if missing:
        problems.append(f"{where}: outputs {missing} are never produced")
    if c.left:
        problems.append(f"{where}: {c.left} bytes after the record's last field")


def _node(c, k, nv, ops, problems, where):
    kind = c.u32("node kind")
    node = {"index": k, "kind": NODE_KINDS.get(kind, f"unknown({kind})")}
    if kind not in NODE_KINDS:
        problems.append(f"{where}: unknown kind {kind}")
    n_in = c.u32("node num_in")
    if n_in > MAX_NODE_INPUTS:
        problems.append(f"{where}: {n_in} inputs, at most {MAX_NODE_INPUTS}")
    node["inputs"] = c.array("i", n_in, "node inputs")
    node["output"] = c.i32("node out")
    node["op"] = c.i32("node op")
    node["kernel"] = tuple(c.array("q", 2, "node kernel"))
    node["stride"] = tuple(c.array("q", 2, "node stride"))
    node["pad"] = tuple(c.array("q", 4, "node pad"))
    flags = c.raw(4, "node flags")
    node["ceil_mode"], node["count_include_pad"], node["keepdim"] = bool(flags[0]), bool(flags[1]), bool(flags[2])
    act = c.u32("node activation")
    node["activation"] = ACTIVATIONS.get(act, f"unknown({act})")
    node["act_min"], node["act_max"] = c.f32("node act_min"), c.f32("node act_max")
    na = c.u32("node num_affine")
    node["num_affine"] = na
    c.array("f", na, "node affine scale")  # prelu: its slopes, attention: its mask, constant: its values,
    # permute_rows: its permutation
    if kind in (9, 19):  # affine, layer_norm: a shift as long
        c.array("f", na, "node affine shift")

    bad = [v for v in node["inputs"] if not 0 <= v < nv]
    if bad:
        problems.append(f"{where} ({node['kind']}): inputs {bad} are not values (0..{nv - 1})")
    if not 0 <= node["output"] < nv:
        problems.append(f"{where} ({node['kind']}): output {node['output']} is not a value (0..{nv - 1})")
    if flags[3]:
        problems.append(f"{where}: padding byte {flags[3]}, expected 0")
    if act not in ACTIVATIONS:
        problems.append(f"{where}: unknown activation {act}")
    elif act == 2 and not node["act_min"] < node["act_max"]:
        problems.append(f"{where}: clamp [{node['act_min']}, {node['act_max']}] is empty")
    name = node["kind"]
    if name in ("conv2d", "linear"):
        if not 0 <= node["op"] < len(ops):
            problems.append(f"{where} ({name}): op {node['op']} is not an op of this file (0..{len(ops) - 1})")
        elif ops[node["op"]]["op"] != name:
            problems.append(f"{where} ({name}): op {node['op']} is a {ops[node['op']]['op']}")
    elif node["op"] != -1:
        problems.append(f"{where} ({name}): op {node['op']}, expected -1 for a {name} node")
    if name in ("maxpool2d", "avgpool2d"):
        if min(node["kernel"] + node["stride"]) < 1 or min(node["pad"]) < 0:
            problems.append(f"{where} ({name}): kernel {node['kernel']}, stride {node['stride']}, "
                            f"pad {node['pad']} out of range")
    if name in ("affine", "prelu", "layer_norm", "constant", "permute_rows") and na == 0:
        problems.append(f"{where}: an {name} node without channels")
    elif name not in ("affine", "prelu", "layer_norm", "attention", "constant", "permute_rows") and na:
        problems.append(f"{where} ({name}): {na} affine channels on a non-affine node")
    want_in = {"add": 2, "mul": 2, "attention": 3}.get(
        name, None if name in ("concat", "resize_nearest", "resize_bilinear", "transpose") else 1)
    if kind in NODE_KINDS and want_in is not None and n_in != want_in:
        problems.append(f"{where} ({name}): {n_in} inputs, expected {want_in}")
    elif name == "concat" and n_in < 1:
        problems.append(f"{where} (concat): no inputs")
    elif (name.startswith("resize") or name == "transpose") and n_in not in (1, 2):
        problems.append(f"{where} ({name}): {n_in} inputs, expected 1 or 2")
    return node


# ---- the whole file ------------------------------------------------------------------

def describe(path, verify=True):
    """Everything a ``.qpk`` file says about itself, and every check that failed.

    Returns a dict: ``path``, ``file_bytes`` (its real size), ``header`` (the
    header's fields, with ``header_checksum_ok`` and ``table_checksum_ok``),
    ``sections`` (type, offset, size, stored checksum, ``ok``: True/False, or
    None when not verified), ``ops`` (index, op, backend, mode, geometry,
    num_weight_scales, has_bias, packed_bytes, original_bytes, layout, ...),
    ``graphs`` (values, inputs, outputs, nodes), ``host_bytes`` (the pickle of the
    saved object), ``data_bytes`` (the large tensors it names in DATA sections), ``verified``
    and ``problems`` (human-readable; empty for a sound file). ``verify``
    checksums every section (the header and table checksums are always
    checked). Raises OSError only when the file cannot be read.
    """
    path = os.fspath(path)
    problems = []
    out = {"path": path, "file_bytes": 0, "header": {}, "sections": [], "ops": [], "graphs": [],
           "host_bytes": 0, "data_bytes": 0, "verified": bool(verify), "problems": problems}
    with open(path, "rb") as f:
        real_size = os.fstat(f.fileno()).st_size
        out["file_bytes"] = real_size
        raw = f.read(HEADER_SIZE)
        if len(raw) < HEADER_SIZE:
            problems.append(f"header: the file has {len(raw)} bytes, fewer than the {HEADER_SIZE}-byte header")
            return out
        h, trusted = _header(raw, real_size, problems)
        out["header"] = h
        if not trusted:
            return out
        table_raw = _table(f, h, real_size, problems)
        if table_raw is None:
            return out
        table_end = h["table_offset"] + len(table_raw)
        sections = _sections(f, table_raw, table_end, real_size, verify, problems)
        out["sections"] = sections

        def records(type_id, new, read_fields, context, what):
            found = []
            for i, sec in enumerate(s for s in sections if s["type_id"] == type_id):
                data = _read_at(f, sec["offset"], sec["size"]) if sec["in_bounds"] else None
                found.append(_record(new(i, sec), data, read_fields, context, problems,
                                     f"{what} {i} (section {sec['index']})"))
            return found

        out["ops"] = records(1, _new_op, _op_fields, sections, "op")
        _check_weight_refs(out["ops"], sections, problems)
        out["graphs"] = records(4, _new_graph, _graph_fields, out["ops"], "graph")
        out["host_bytes"] = sum(s["size"] for s in sections if s["type_id"] == 5)
        out["data_bytes"] = sum(s["size"] for s in sections if s["type_id"] == 6)
    return out


def _check_weight_refs(ops, sections, problems):
    """Each PACKED and ORIGINAL section belongs to exactly one op."""
    users = {}
    for op in ops:
        for field in ("packed_section", "original_section"):
            idx = op.get(field, -1)
            if 0 <= idx < len(sections):
                users.setdefault(idx, []).append(op["index"])
    for s in sections:
        if s["type_id"] not in (2, 3):
            continue
        u = users.get(s["index"], [])
        if len(u) > 1:
            problems.append(f"section {s['index']} ({s['type']}) is claimed by ops {u}")
        elif not u:
            problems.append(f"section {s['index']} ({s['type']}) belongs to no op")
