# The three training programs' command lines through the launcher on 2 ranks
# (program_flags.sh): a bad flag names itself and what it expects, once for the job, with
# a non-zero exit and no Open MPI banner. No data are read: every case ends before that.
if(NOT TARGET fashion_mnist OR NOT TARGET resnet50 OR NOT TARGET transformer OR NOT TARGET tarantella_launcher)
  return()
endif()
foreach(_case not_a_value unknown_or_incomplete out_of_range callback_flags)
  add_test(NAME program_flags.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/program_flags.sh $<TARGET_FILE:tarantella_launcher>
                   $<TARGET_FILE:fashion_mnist> $<TARGET_FILE:resnet50> $<TARGET_FILE:transformer> ${_case})
  set_tests_properties(program_flags.${_case} PROPERTIES
                       TIMEOUT 300 LABELS e2e
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endforeach()
