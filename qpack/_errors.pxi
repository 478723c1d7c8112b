# The one place where a core status becomes a Python exception.

class Error(Exception):
    """Base class of every qpack error."""


class ClosedError(Error, ValueError):
    """The packed object was closed; create a new one."""


class InvalidArgumentError(Error, ValueError):
    """A shape, value or quantization parameter is not valid."""


class InvalidTypeError(Error, TypeError):
    """An input has the wrong dtype or kind."""


class UnsupportedError(Error, NotImplementedError):
    """Valid, but not supported by the chosen backend."""


class BackendError(Error, RuntimeError):
    """oneDNN or QNNPACK reported a failure."""


class OutOfMemoryError(Error, MemoryError):
    """An allocation failed."""


class FileFormatError(Error, ValueError):
    """A model file is corrupt, truncated, of another format version, or
    packed for another build or CPU and loaded with strict=True."""


class FileIOError(Error, OSError):
    """A model file could not be opened, read or written."""


_STATUS_TO_ERROR = {
    QPACK_STATUS_INVALID_ARGUMENT: InvalidArgumentError,
    QPACK_STATUS_INVALID_TYPE: InvalidTypeError,
    QPACK_STATUS_UNSUPPORTED: UnsupportedError,
    QPACK_STATUS_OUT_OF_MEMORY: OutOfMemoryError,
    QPACK_STATUS_CLOSED: ClosedError,
    QPACK_STATUS_BACKEND_ERROR: BackendError,
    QPACK_STATUS_FILE_FORMAT: FileFormatError,
    QPACK_STATUS_IO: FileIOError,
}


cdef int check_status(qpack_status status) except -1:
    if status == QPACK_STATUS_SUCCESS:
        return 0
    message = qpack_last_error().decode("utf-8", "replace")
    raise _STATUS_TO_ERROR.get(status, Error)(message)
