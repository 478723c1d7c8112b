# oneDNN from the PyPI wheels onednn-devel-cpu-gomp (build) / onednn-cpu-gomp (run).
# The devel wheel installs <prefix>/lib/cmake/dnnl/dnnl-config.cmake; search the
# Python prefixes we know of before giving up with a message naming the package.
set(_qpack_dnnl_hints "")
foreach(_p IN ITEMS "${Python_EXECUTABLE}" "$ENV{VIRTUAL_ENV}/bin/python")
  if(_p AND EXISTS "${_p}")
    execute_process(COMMAND "${_p}" -c "import sys; print(sys.prefix); print(sys.base_prefix)"
      OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REPLACE "\n" ";" _out "${_out}")
    list(APPEND _qpack_dnnl_hints ${_out})
  endif()
endforeach()
if(DEFINED ENV{VIRTUAL_ENV})
  list(APPEND _qpack_dnnl_hints "$ENV{VIRTUAL_ENV}")
endif()
# scikit-build-core's isolated build environment puts its prefix on CMAKE_PREFIX_PATH.
find_package(dnnl 3.2 CONFIG QUIET HINTS ${_qpack_dnnl_hints})
if(NOT dnnl_FOUND)
  message(FATAL_ERROR
    "qpack: oneDNN (dnnl-config.cmake) not found. Install the PyPI package "
    "'onednn-devel-cpu-gomp==2023.2.0' into the Python environment that builds qpack "
    "(pip install onednn-devel-cpu-gomp==2023.2.0), or pass -Ddnnl_DIR=<dir with dnnl-config.cmake>.")
endif()
get_target_property(_qpack_dnnl_loc DNNL::dnnl IMPORTED_LOCATION_RELEASE)
if(NOT _qpack_dnnl_loc)
  get_target_property(_qpack_dnnl_loc DNNL::dnnl IMPORTED_LOCATION_NOCONFIG)
endif()
message(STATUS "qpack: oneDNN ${dnnl_VERSION} from ${dnnl_DIR} (${_qpack_dnnl_loc})")
find_package(OpenMP REQUIRED COMPONENTS CXX)
