# The command lines of the tutorials our users come from (../shared/seeds: Tarantella's
# ResNet-50 and Transformer tutorials and advanced topics, the ALCF Horovod tutorial), as
# written there, adapted only to our programs and small data (tutorials.sh says how).
foreach(_t tarantella_launcher resnet50 transformer transformer_data fashion_mnist pi test_resnet50)
  if(NOT TARGET ${_t})
    return()
  endif()
endforeach()
foreach(_case resnet50 transformer fusion_threshold pinning local_batch horovod_np pi)
  add_test(NAME tutorials.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tutorials.sh $<TARGET_FILE_DIR:tarantella_launcher>
                   ${PROJECT_SOURCE_DIR} ${_case})
  # Two ranks, or four light ones (pi): the machine's two cores.
  set_tests_properties(tutorials.${_case} PROPERTIES TIMEOUT 300 LABELS e2e PROCESSORS 2
                       ENVIRONMENT "TNT_NUM_THREADS=1")
endforeach()
