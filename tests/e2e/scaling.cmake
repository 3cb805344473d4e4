# Scaling profile and prediction (docs/scaling.md) through the launcher on fashion_mnist.
if(NOT TARGET fashion_mnist OR NOT TARGET tarantella_launcher)
  return()
endif()
add_test(NAME scaling.profile
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scaling_profile.sh $<TARGET_FILE:tarantella_launcher>
                 $<TARGET_FILE:fashion_mnist>)
set_tests_properties(scaling.profile PROPERTIES TIMEOUT 240 LABELS e2e
                     ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
