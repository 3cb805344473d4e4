# Where `cmake --install build --prefix P` puts things (GNU layout: P/bin, P/lib,
# P/include, P/lib/cmake/tarantella, P/lib/pkgconfig), and the RPATHs the installed
# binaries carry so that they find their libraries without LD_LIBRARY_PATH:
#   TNT_INSTALL_RPATH_BIN  for executables in bin/: $ORIGIN/../lib (relative, so the prefix
#                          can move)
#   TNT_INSTALL_RPATH_LIB  for libraries in lib/: $ORIGIN
# Targets add INSTALL_RPATH_USE_LINK_PATH, which keeps the directories of dependencies
# outside the system's default paths (CUDA, cuDNN, NCCL under /usr/local/cuda, Open MPI's
# private lib directory). Only install rules use these: the build tree keeps CMake's build
# RPATHs.
include(GNUInstallDirs)

file(RELATIVE_PATH _tnt_bin_to_lib ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
set(TNT_INSTALL_RPATH_BIN "$ORIGIN/${_tnt_bin_to_lib}")
set(TNT_INSTALL_RPATH_LIB "$ORIGIN")
set(TNT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tarantella)
