# Packed model files: save handles to a .qpk file, load one (included by _core.pyx).
from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy
from cpython.buffer cimport PyBuffer_FillInfo


cdef class _HeapSection:
    """A writable buffer over a DATA section of a model read into memory
    (mmap=False): the core's private heap copy of the file, kept alive here."""
    cdef object owner
    cdef char* ptr
    cdef Py_ssize_t size

    def __getbuffer__(self, Py_buffer* buf, int flags):
        PyBuffer_FillInfo(buf, self, self.ptr, self.size, 0, flags)

    def __releasebuffer__(self, Py_buffer* buf):
        pass


def save_model(str path, linears, convs, graphs, bytes host, data, bint with_originals):
    """Writes a .qpk file of LinearHandles, Conv2dHandles, GraphHandles, host
    bytes and data blobs (C-contiguous numpy uint8 arrays)."""
    cdef qpack_save_params p
    cdef int nl = len(linears), nc = len(convs), ng = len(graphs), nd = len(data)
    cdef const void** ds = <const void**>calloc(max(nd, 1), sizeof(void*))
    cdef size_t* dsz = <size_t*>calloc(max(nd, 1), sizeof(size_t))
    cdef const uint8_t[::1] dv
    cdef const qpack_linear** ls = <const qpack_linear**>calloc(max(nl, 1), sizeof(void*))
    cdef const qpack_conv2d** cs = <const qpack_conv2d**>calloc(max(nc, 1), sizeof(void*))
    cdef const qpack_graph** gs = <const qpack_graph**>calloc(max(ng, 1), sizeof(void*))
    cdef bytes cpath = path.encode()
    cdef const char* cp = cpath
    cdef const unsigned char* hp = host
    cdef qpack_status st
    if ls == NULL or cs == NULL or gs == NULL or ds == NULL or dsz == NULL:
        free(ls); free(cs); free(gs); free(ds); free(dsz)
        raise MemoryError()
    try:
        for i in range(nd):
            dv = data[i]
            dsz[i] = dv.shape[0]
            ds[i] = &dv[0] if dv.shape[0] > 0 else NULL
        for i in range(nl):
            ls[i] = (<LinearHandle?>linears[i])._h
        for i in range(nc):
            cs[i] = (<Conv2dHandle?>convs[i])._h
        for i in range(ng):
            gs[i] = (<GraphHandle?>graphs[i])._h
        p.num_linears, p.linears = nl, ls
        p.num_convs, p.convs = nc, cs
        p.num_graphs, p.graphs = ng, gs
        p.host_data = hp
        p.host_size = len(host)
        p.with_originals = with_originals
        p.num_data, p.data, p.data_sizes = nd, ds, dsz
        with nogil:
            st = qpack_model_save(&p, cp)
        check_status(st)
    finally:
        free(ls); free(cs); free(gs); free(ds); free(dsz)


cdef class ModelHandle:
    """A loaded .qpk file: its ops as handles, its host bytes, what was re-packed."""
    cdef qpack_model* _m
    cdef readonly dict info
    cdef readonly list repacked

    def __cinit__(self, str path, int fd=-1, bint mmap=True, bint verify=True, bint strict=False):
        self._m = NULL
        cdef qpack_load_options o
        qpack_load_options_init(&o)
        o.map, o.verify, o.strict = mmap, verify, strict
        cdef bytes cpath = path.encode()
        cdef const char* cp = cpath
        cdef qpack_model* m = NULL
        cdef qpack_status st
        with nogil:
            if fd >= 0:
                st = qpack_model_load_fd(fd, cp, &o, &m)
            else:
                st = qpack_model_load(cp, &o, &m)
        check_status(st)
        self._m = m
        cdef qpack_model_info i
        check_status(qpack_model_get_info(m, &i))
        self.info = {"num_ops": i.num_ops, "num_graphs": i.num_graphs,
                     "num_repacked": i.num_repacked, "mapped": bool(i.mapped),
                     "file_size": i.file_size, "nbytes_in_place": i.nbytes_in_place,
                     "host_size": i.host_size, "num_data": i.num_data}
        cdef char buf[1024]
        self.repacked = []
        for k in range(i.num_repacked):
            check_status(qpack_model_repacked(m, k, buf, sizeof(buf)))
            self.repacked.append(buf.decode("utf-8", "replace"))

    def __dealloc__(self):
        if self._m != NULL:
            qpack_model_destroy(self._m)
            self._m = NULL

    def ops(self):
        """Every op of the file, in file order, as a new LinearHandle or Conv2dHandle."""
        cdef qpack_op_kind kind
        cdef qpack_linear* lh
        cdef qpack_conv2d* ch
        out = []
        for k in range(self.info["num_ops"]):
            check_status(qpack_model_op_kind(self._m, k, &kind))
            if kind == QPACK_OP_LINEAR:
                lh = NULL
                check_status(qpack_model_linear(self._m, k, &lh))
                out.append(_adopt_linear(lh))
            else:
                ch = NULL
                check_status(qpack_model_conv2d(self._m, k, &ch))
                out.append(_adopt_conv2d(ch))
        return out

    def data_location(self, int index):
        """(offset in the file, size) of DATA section `index`."""
        cdef const void* data = NULL
        cdef size_t size = 0
        cdef uint64_t offset = 0
        check_status(qpack_model_data(self._m, index, &data, &size, &offset))
        return int(offset), int(size)

    def data_heap_view(self, int index):
        """A writable buffer over DATA section `index` in the core's own copy of
        the file (a model loaded without mmap: its bytes are private to this
        process and never read again by the core)."""
        if self.info["mapped"]:
            raise InvalidArgumentError("the model is mapped read-only; map its DATA copy-on-write instead")
        cdef const void* data = NULL
        cdef size_t size = 0
        cdef uint64_t offset = 0
        check_status(qpack_model_data(self._m, index, &data, &size, &offset))
        cdef _HeapSection view = _HeapSection.__new__(_HeapSection)
        view.owner = self
        view.ptr = <char*>data
        view.size = size
        return view

    def host(self):
        """A copy of the host section's bytes (b"" when there is none)."""
        cdef const void* data = NULL
        cdef size_t size = 0
        check_status(qpack_model_host(self._m, &data, &size))
        if size == 0:
            return b""
        return (<const char*>data)[:size]
