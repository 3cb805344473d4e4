# The Transformer program: beam search against exhaustive search (transformer_beam_search),
# decoding with the key/value cache against the uncached reference (transformer_decode_cache),
# and build/bin/transformer through the launcher (transformer_program.sh): 1, 2 and 3 ranks
# give the same weights, manual distribution floors a batch the ranks do not divide, bad
# flags fail naming the flag, and a small generated corpus is learned (loss falls, BLEU
# printed, translations.txt written), --enable_time_history prints real tokens/s. Each case
# runs in well under a minute.
if(NOT TARGET tnt_transformer)
  return()
endif()
tnt_add_test(NAME transformer_beam_search SOURCES transformer_beam_search.cpp LIBS tnt_transformer TIMEOUT 120
             LABELS e2e)
set_property(TEST transformer_beam_search APPEND PROPERTY ENVIRONMENT TNT_NUM_THREADS=1)
tnt_add_test(NAME transformer_decode_cache SOURCES transformer_decode_cache.cpp LIBS tnt_transformer TIMEOUT 120
             LABELS e2e)
set_property(TEST transformer_decode_cache APPEND PROPERTY ENVIRONMENT TNT_NUM_THREADS=1)
if(TNT_WITH_CUDA)
  # The cached decoding path on CUDA against the CPU.
  tnt_add_test(NAME transformer_decode_cache_cuda SOURCES transformer_decode_cache_cuda.cpp LIBS tnt_transformer
               TIMEOUT 120 LABELS gpu)
  # A training step (dropout on) on CUDA in f32 and bf16 against the CPU's: every GPU-only
  # path of a Transformer step together.
  tnt_add_test(NAME transformer_train_cuda SOURCES transformer_train_cuda.cpp LIBS tnt_transformer
               TIMEOUT 120 LABELS gpu)
  # Its bf16 step compares dropout masks with the CPU's (the same Philox draws): cuDNN's
  # attention draws its own, so TNT_CUDNN_ATTENTION=auto (the default) could take it there.
  set_tests_properties(transformer_train_cuda PROPERTIES ENVIRONMENT "${TNT_TEST_ENV};TNT_CUDNN_ATTENTION=0")
endif()

if(NOT TARGET transformer OR NOT TARGET tarantella_launcher OR NOT TARGET transformer_data)
  return()
endif()
foreach(_case ranks_1_2_3 manual_indivisible bad_param_set missing_vocab_file batch_below_max_length learns_demo
              resume bleu_files_mismatch dtype decode_cache model_too_big empty_translation evaluation_fails
              data_tool_inputs time_history long_source_line epoch_count)
  add_test(NAME transformer.program.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/transformer_program.sh
                   $<TARGET_FILE:tarantella_launcher> $<TARGET_FILE:transformer> $<TARGET_FILE:transformer_data>
                   ${PROJECT_SOURCE_DIR} ${_case})
  set_tests_properties(transformer.program.${_case} PROPERTIES
                       TIMEOUT 240 LABELS e2e
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endforeach()
# --micro_batch_size (tokens per rank) on 2 and 3 ranks: the run of --batch_size micro x ranks.
add_test(NAME transformer.program.micro_batch_size
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/transformer_program.sh
                 $<TARGET_FILE:tarantella_launcher> $<TARGET_FILE:transformer> $<TARGET_FILE:transformer_data>
                 ${PROJECT_SOURCE_DIR} micro_batch_size)
set_tests_properties(transformer.program.micro_batch_size PROPERTIES
                     TIMEOUT 300 LABELS e2e
                     ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
