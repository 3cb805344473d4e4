# The installed package, for programs built outside this tree:
#   P/lib/cmake/tarantella/tarantellaConfig.cmake (+ ConfigVersion, Targets)
#     find_package(tarantella) -> tarantella::tarantella (the library), tarantella::text (text
#     processing for translation models, runtime/text/), tarantella::launcher
#     and tarantella::rank_info (the executables), tarantella_WITH_CUDA.
#   P/lib/pkgconfig/tarantella.pc
# Public dependencies are what the public headers need: fmt (check.hpp's macros and
# log.hpp's print/log templates format in the caller's code) and Threads. MPI, oneDNN,
# protobuf, CUDA and the rest stay private: libtarantella.so carries them as its own NEEDED
# entries and finds them through its RPATH, so a consumer neither includes nor links them.
# (libtarantella is always a shared library; a static one would have to pass every private
# dependency on, e.g. find_dependency(Protobuf) here, and export tnt_dnnl & co.)
include(CMakePackageConfigHelpers)

install(EXPORT tarantellaTargets
        NAMESPACE tarantella::
        DESTINATION ${TNT_INSTALL_CMAKEDIR}
        FILE tarantellaTargets.cmake)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tarantellaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/tarantellaConfig.cmake
  INSTALL_DESTINATION ${TNT_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/tarantellaConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/tarantellaConfig.cmake
              ${PROJECT_BINARY_DIR}/package/tarantellaConfigVersion.cmake
        DESTINATION ${TNT_INSTALL_CMAKEDIR})

# tarantella.pc is written at install time, when the prefix is known (cmake --install
# --prefix P may differ from CMAKE_INSTALL_PREFIX). Where the library directory is inside
# the prefix, the prefix is found from the .pc file's own place (${pcfiledir}/../..), as the
# CMake package finds its own: a relative --prefix, a moved or copied prefix, or a prefix
# with a space in it give pkg-config the paths where the files are. Its Cflags carry what
# the CMake target's interface carries (include directory, TNT_WITH_CUDA=1 in a CUDA
# build) except the C++ standard: the consumer chooses
# -std=c++20 or newer (a -std in Cflags could lower the consumer's own). Libs add an RPATH
# to the library's directory, so a program linked with them runs without LD_LIBRARY_PATH.
foreach(_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(_tnt_pc_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(_tnt_pc_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
# ${pcfiledir} is <prefix>/<libdir>/pkgconfig: up one level for pkgconfig and one for each
# part of a relative libdir (lib, or lib/x86_64-linux-gnu).
set(_tnt_pc_prefix "")
if(NOT IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(_tnt_pc_prefix "\${pcfiledir}/..")
  string(REPLACE "/" ";" _tnt_libdir_parts "${CMAKE_INSTALL_LIBDIR}")
  foreach(_part IN LISTS _tnt_libdir_parts)
    if(NOT _part STREQUAL "" AND NOT _part STREQUAL ".")
      string(APPEND _tnt_pc_prefix "/..")
    endif()
  endforeach()
endif()
set(_tnt_pc_cflags "")
if(TNT_WITH_CUDA)
  set(_tnt_pc_cflags " -DTNT_WITH_CUDA=1")
endif()
# Bracket arguments in the generated install script keep ${prefix} literal.
install(CODE "
set(TNT_PC_PREFIX [==[${_tnt_pc_prefix}]==])
if(TNT_PC_PREFIX STREQUAL \"\")
  set(TNT_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
endif()
set(TNT_PC_LIBDIR [==[${_tnt_pc_LIBDIR}]==])
set(TNT_PC_INCLUDEDIR [==[${_tnt_pc_INCLUDEDIR}]==])
set(TNT_PC_CFLAGS [==[${_tnt_pc_cflags}]==])
set(TNT_PC_VERSION [==[${PROJECT_VERSION}]==])
set(TNT_PC_FMT_MAJOR [==[${fmt_VERSION_MAJOR}]==])
configure_file([==[${PROJECT_SOURCE_DIR}/cmake/tarantella.pc.in]==]
               [==[${PROJECT_BINARY_DIR}/package/tarantella.pc]==] @ONLY)
")
install(FILES ${PROJECT_BINARY_DIR}/package/tarantella.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
