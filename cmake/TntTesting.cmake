# tnt_add_test(NAME n SOURCES a.cpp... [RANKS 1 2 3 ...] [LABELS l...] [LIBS t...]
#              [TIMEOUT s] [NO_MPI_MAIN] [PROCESSORS p] [PER_FILE])
#
# Builds build/bin/test_<n> from the sources plus a Catch2 main. By default the main is
# tests/support/catch_mpi_main.cpp: it calls tnt::init, runs Catch2 on every rank and
# fails on every rank when any rank failed. With RANKS, one CTest test per count runs it
# under `mpirun -np N --oversubscribe`; if the ranks cannot start, mpirun fails and so does
# the test (nothing is skipped). Without RANKS it runs as a single process.
# PROCESSORS: CTest's slots a test takes (default 2 with RANKS, else 1). Tests that mostly
# wait (timeouts, launched jobs) take 1, so that the 2-core suite runs work beside them.
# PER_FILE: one CTest test per source named test_<part>.cpp, called n.<part>, running that
# file's cases (Catch2's file-name tags; none found fails): a long binary's files run side by side.
set(TNT_TEST_MPIRUN_FLAGS --allow-run-as-root --oversubscribe --bind-to none
    --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)
# OpenMP threads that spin while waiting take the cores that the other ranks and tests
# running beside them need (2-core CI): they wait passively.
set(TNT_TEST_ENV "OMP_WAIT_POLICY=PASSIVE;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;TNT_COLLECTIVE_TIMEOUT=120;OMPI_MCA_rmaps_base_oversubscribe=1")

add_library(tnt_catch_main OBJECT ${PROJECT_SOURCE_DIR}/tests/support/catch_main.cpp)
target_link_libraries(tnt_catch_main PUBLIC Catch2::Catch2)
add_library(tnt_catch_mpi_main OBJECT ${PROJECT_SOURCE_DIR}/tests/support/catch_mpi_main.cpp)
target_link_libraries(tnt_catch_mpi_main PUBLIC Catch2::Catch2 tarantella)

function(tnt_add_test)
  cmake_parse_arguments(T "NO_MPI_MAIN;PER_FILE" "NAME;TIMEOUT;PROCESSORS" "SOURCES;RANKS;LABELS;LIBS" ${ARGN})
  set(target test_${T_NAME})
  add_executable(${target} ${T_SOURCES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support
                                               ${PROJECT_SOURCE_DIR}/runtime/src)
  if(T_NO_MPI_MAIN)
    target_link_libraries(${target} PRIVATE tnt_catch_main Catch2::Catch2 ${T_LIBS})
  else()
    target_link_libraries(${target} PRIVATE tnt_catch_mpi_main Catch2::Catch2 tarantella ${T_LIBS})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(NOT T_PROCESSORS)
    set(T_PROCESSORS 1)
    if(T_RANKS)
      set(T_PROCESSORS 2)
    endif()
  endif()
  if(T_PER_FILE AND T_RANKS)
    message(FATAL_ERROR "tnt_add_test(${T_NAME}): PER_FILE is for single-process tests")
  endif()
  if(T_PER_FILE)
    set(parts "")
    foreach(src IN LISTS T_SOURCES)
      get_filename_component(stem ${src} NAME_WE)
      if(stem MATCHES "^test_(.+)$")
        set(part ${CMAKE_MATCH_1})
        list(APPEND parts ${part})
        add_test(NAME ${T_NAME}.${part} COMMAND ${target} --warn NoTests --filenames-as-tags "[#${stem}]")
        set_tests_properties(${T_NAME}.${part} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${TNT_TEST_ENV}"
                             LABELS "${T_LABELS}" PROCESSORS ${T_PROCESSORS})
      endif()
    endforeach()
    if(NOT parts)
      message(FATAL_ERROR "tnt_add_test(${T_NAME}): PER_FILE without a source named test_<part>.cpp")
    endif()
  elseif(T_RANKS)
    foreach(np IN LISTS T_RANKS)
      set(test_name ${T_NAME}.np${np})
      add_test(NAME ${test_name}
               COMMAND ${MPIEXEC_EXECUTABLE} ${TNT_TEST_MPIRUN_FLAGS} -np ${np} $<TARGET_FILE:${target}>)
      set_tests_properties(${test_name} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${TNT_TEST_ENV}"
                           LABELS "${T_LABELS};mpi" PROCESSORS ${T_PROCESSORS})
    endforeach()
  else()
    add_test(NAME ${T_NAME} COMMAND ${target})
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${TNT_TEST_ENV}"
                         LABELS "${T_LABELS}" PROCESSORS ${T_PROCESSORS})
  endif()
endfunction()
