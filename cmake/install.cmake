# `cmake --install` of the C library (not of the Python build, whose wheel
# scikit-build-core assembles from qpack/CMakeLists.txt's own rules):
#
#   <prefix>/include/qpack/qpack.h
#   <prefix>/lib/libqpack.so*             exports only qpack_*; RUNPATH $ORIGIN
#   <prefix>/lib/libqpack_static.a        qpack + QNNPACK + clog in one archive
#   <prefix>/lib/cmake/qpack/             find_package(qpack CONFIG): qpack::qpack,
#                                         COMPONENTS static: qpack::qpack_static
#   <prefix>/lib/pkgconfig/qpack.pc, qpack-static.pc
#   <prefix>/lib/libcpuinfo.so.0, libpthreadpool.so.0 (QPACK_INSTALL_RUNTIME_DEPS:
#                                         what a target system such as a phone lacks)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(QPACK_BUILD_PYTHON)
  set(_qpack_install_default OFF)
else()
  set(_qpack_install_default ON)
endif()
option(QPACK_INSTALL "cmake --install installs the C library (builds libqpack.so by default)"
  ${_qpack_install_default})
option(QPACK_INSTALL_RUNTIME_DEPS
  "Install the shared cpuinfo/pthreadpool libqpack.so needs next to it (default: when cross-compiling)"
  ${CMAKE_CROSSCOMPILING})
if(NOT QPACK_INSTALL)
  return()
endif()

set(_qpack_rpath "$ORIGIN")
if(QPACK_WITH_ONEDNN)
  # Also where oneDNN's libdnnl.so.3 was linked from (a wheel, a conda prefix).
  get_filename_component(_qpack_dnnl_libdir "${_qpack_dnnl_loc}" DIRECTORY)
  list(APPEND _qpack_rpath "${_qpack_dnnl_libdir}")
endif()
set_target_properties(qpack PROPERTIES EXCLUDE_FROM_ALL OFF INSTALL_RPATH "${_qpack_rpath}")

# One static archive with everything qpack links statically, so that a static
# consumer needs only the shared system libraries listed in qpack-static.pc.
set(_qpack_archives qpack_core)
foreach(_t pytorch_qnnpack clog cpuinfo pthreadpool)
  if(TARGET ${_t})
    get_target_property(_type ${_t} TYPE)
    get_target_property(_imported ${_t} IMPORTED)
    if(_type STREQUAL "STATIC_LIBRARY" AND NOT _imported)
      list(APPEND _qpack_archives ${_t})
    endif()
  endif()
endforeach()
set(_mri "CREATE ${CMAKE_CURRENT_BINARY_DIR}/libqpack_static.a\n")
foreach(_t IN LISTS _qpack_archives)
  string(APPEND _mri "ADDLIB $<TARGET_FILE:${_t}>\n")
endforeach()
string(APPEND _mri "SAVE\nEND\n")
file(GENERATE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/qpack_static.mri CONTENT "${_mri}")
add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/libqpack_static.a
  COMMAND ${CMAKE_COMMAND} -E rm -f ${CMAKE_CURRENT_BINARY_DIR}/libqpack_static.a
  COMMAND ${CMAKE_AR} -M < ${CMAKE_CURRENT_BINARY_DIR}/qpack_static.mri
  DEPENDS ${_qpack_archives} ${CMAKE_CURRENT_BINARY_DIR}/qpack_static.mri
  COMMENT "Merging ${_qpack_archives} into libqpack_static.a" VERBATIM)
add_custom_target(qpack_static ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/libqpack_static.a)

# What the static archive needs from the system, for qpackConfig.cmake and
# qpack-static.pc: Debian's shared cpuinfo (and pthreadpool, unless qpack's
# threadpool_omp.cc provides it), found by QNNPACK's CMake as cache variables.
set(_qpack_pc_libs "")
set(_qpack_runtime_libs "")
set(QPACK_STATIC_SYSTEM_LIBS "")
foreach(_name cpuinfo pthreadpool)
  string(TOUPPER ${_name} _dep)
  if(NOT QPACK_WITH_QNNPACK OR NOT USE_SYSTEM_${_dep} OR NOT ${_dep}_LIBRARY)
    continue()
  endif()
  if(_name STREQUAL "pthreadpool" AND QPACK_OPENMP)
    continue()
  endif()
  string(APPEND _qpack_pc_libs " -l${_name}")
  list(APPEND QPACK_STATIC_SYSTEM_LIBS ${_name})
  list(APPEND _qpack_runtime_libs "${${_dep}_LIBRARY}")
endforeach()
if(QPACK_OPENMP)
  string(APPEND _qpack_pc_libs " -fopenmp")
endif()
if(QPACK_WITH_ONEDNN)
  string(APPEND _qpack_pc_libs " -L${_qpack_dnnl_libdir} -Wl,-rpath,${_qpack_dnnl_libdir} -ldnnl")
endif()
string(APPEND _qpack_pc_libs " -lstdc++ -lm -lpthread")

install(TARGETS qpack EXPORT qpackTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/src/include/qpack/qpack.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/qpack)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/libqpack_static.a DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(QPACK_INSTALL_RUNTIME_DEPS)
  # libcpuinfo.so.0 and libpthreadpool.so.0 (Debian ships both shared only), under
  # their sonames, and the link-time names for static consumers.
  foreach(_lib IN LISTS _qpack_runtime_libs)
    get_filename_component(_real "${_lib}" REALPATH)
    get_filename_component(_base "${_lib}" NAME)
    install(FILES "${_real}" DESTINATION ${CMAKE_INSTALL_LIBDIR} RENAME "${_base}.0")
    install(CODE "file(CREATE_LINK ${_base}.0 \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/${_base}\" SYMBOLIC)")
  endforeach()
endif()

set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/qpack)
install(EXPORT qpackTargets NAMESPACE qpack:: DESTINATION ${_cmakedir})
set(QPACK_DNNL_DIR "${dnnl_DIR}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qpackConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/qpackConfig.cmake INSTALL_DESTINATION ${_cmakedir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/qpackConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/qpackConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/qpackConfigVersion.cmake DESTINATION ${_cmakedir})

set(QPACK_PC_LIBS_STATIC "${_qpack_pc_libs}")
foreach(_pc qpack qpack-static)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${_pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${_pc}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${_pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
