# The commands of the README and of its docs pages, in order, as a user pastes them
# (readme_commands.sh: how each block is checked is marked in the markdown).
if(NOT TARGET fashion_mnist OR NOT TARGET resnet50 OR NOT TARGET transformer OR NOT TARGET pi
   OR NOT TARGET tarantella_launcher)
  return()
endif()
add_test(NAME readme.commands
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/readme_commands.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR})
# About 40 commands, most of them dry runs; the runs train for seconds each.
set_tests_properties(readme.commands PROPERTIES
                     TIMEOUT 900 LABELS e2e
                     ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
