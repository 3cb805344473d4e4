# examples/pi through the launcher (pi.sh): the same estimate on 1, 2 and 3 ranks, within a
# stated bound of pi; a bad flag ends every rank with exit status 2 and one message.
if(NOT TARGET pi OR NOT TARGET tarantella_launcher)
  return()
endif()
foreach(_case ranks bad_flags)
  add_test(NAME pi.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/pi.sh $<TARGET_FILE:tarantella_launcher> $<TARGET_FILE:pi> ${_case})
  # Up to 3 ranks on this machine: nothing else multi-rank beside it.
  set_tests_properties(pi.${_case} PROPERTIES TIMEOUT 180 LABELS e2e PROCESSORS 2
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endforeach()
