# oneDNN (dnnl-config.cmake) from one of:
# - the PyPI wheels onednn-devel-cpu-gomp (build) / onednn-cpu-gomp (run), which
#   install <python prefix>/lib/cmake/dnnl and <python prefix>/lib/libdnnl.so.3;
# - a conda prefix (conda-forge's `onednn`, see conda/recipe.yaml), laid out as
#   $PREFIX/lib/cmake/dnnl, $PREFIX/lib/libdnnl.so.3 and $PREFIX/include;
# - any other install, through CMAKE_PREFIX_PATH or -Ddnnl_DIR=<dir>.
# find_package searches dnnl_DIR and CMAKE_PREFIX_PATH (where scikit-build-core's
# isolated build environment and conda's CMAKE_ARGS put their prefixes) before
# these hints: the Python prefixes we know of, then the conda host prefix of a
# conda-build/rattler-build run ($PREFIX) and the active conda environment.
set(_qpack_dnnl_hints "")
foreach(_p IN ITEMS "${Python_EXECUTABLE}" "$ENV{VIRTUAL_ENV}/bin/python")
  if(_p AND EXISTS "${_p}")
    execute_process(COMMAND "${_p}" -c "import sys; print(sys.prefix); print(sys.base_prefix)"
      OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REPLACE "\n" ";" _out "${_out}")
    list(APPEND _qpack_dnnl_hints ${_out})
  endif()
endforeach()
foreach(_v IN ITEMS VIRTUAL_ENV PREFIX CONDA_PREFIX)
  if(DEFINED ENV{${_v}} AND NOT "$ENV{${_v}}" STREQUAL "")
    list(APPEND _qpack_dnnl_hints "$ENV{${_v}}")
  endif()
endforeach()
find_package(dnnl 3.2 CONFIG QUIET HINTS ${_qpack_dnnl_hints})
if(NOT dnnl_FOUND)
  message(FATAL_ERROR
    "qpack: oneDNN >= 3.2 (dnnl-config.cmake) not found. Either install the PyPI package "
    "'onednn-devel-cpu-gomp==2023.2.0' into the Python environment that builds qpack "
    "(pip install onednn-devel-cpu-gomp==2023.2.0), or, in a conda environment, "
    "'conda install -c conda-forge onednn onednn-cpu-omp' and pass its prefix as "
    "-DCMAKE_PREFIX_PATH=<prefix> (conda-build and rattler-build do through CMAKE_ARGS), "
    "or pass -Ddnnl_DIR=<dir with dnnl-config.cmake>.")
endif()
get_target_property(_qpack_dnnl_loc DNNL::dnnl IMPORTED_LOCATION_RELEASE)
if(NOT _qpack_dnnl_loc)
  get_target_property(_qpack_dnnl_loc DNNL::dnnl IMPORTED_LOCATION_NOCONFIG)
endif()
# Where it came from, for the build log (conda/check_prefix_build.sh reads it):
# a prefix with a onednn-devel-* wheel's metadata is the wheel, otherwise a
# plain prefix such as conda's.
get_filename_component(_qpack_dnnl_prefix "${dnnl_DIR}/../../.." ABSOLUTE)
file(GLOB _qpack_dnnl_wheel "${_qpack_dnnl_prefix}/lib/python*/site-packages/onednn_devel_*.dist-info")
if(_qpack_dnnl_wheel)
  set(_qpack_dnnl_kind "wheel")
else()
  set(_qpack_dnnl_kind "prefix")
endif()
message(STATUS "qpack: oneDNN ${dnnl_VERSION} from ${dnnl_DIR} (${_qpack_dnnl_kind} ${_qpack_dnnl_prefix}; ${_qpack_dnnl_loc})")
find_package(OpenMP REQUIRED COMPONENTS CXX)
