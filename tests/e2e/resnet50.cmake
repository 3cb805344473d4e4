# The ResNet-50 model (names, count, strides, forward/backward, a few training steps, the
# learning-rate schedule) and the resnet50 program through the launcher on 2 ranks with
# synthetic data. Everything runs at image size 32: a few seconds, not minutes.
set(_rn_src ${PROJECT_SOURCE_DIR}/models/resnet50)
tnt_add_test(NAME resnet50 SOURCES test_resnet50.cpp ${_rn_src}/resnet.cpp TIMEOUT 300 LABELS e2e)
target_include_directories(test_resnet50 PRIVATE ${_rn_src} ${PROJECT_SOURCE_DIR}/models)  # common/wording.hpp
target_compile_definitions(test_resnet50 PRIVATE TNT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# One thread: on a loaded 2-core machine oneDNN's OpenMP threads wait on each other, and the
# file took 57 s with 2 threads against 12 s with 1 (load average 4.5).
set_property(TEST resnet50 APPEND PROPERTY ENVIRONMENT TNT_NUM_THREADS=1)

if(NOT TARGET resnet50 OR NOT TARGET tarantella_launcher)
  return()
endif()
# Cases of resnet50_launcher.sh: a 2-rank synthetic run (exit 0, images/s, history.csv,
# checkpoint), its step logs, schedule and evaluation line, a micro-batch of one 32x32 image
# refused by name, a 2-rank run on a tiny ImageNet in the folder layout (written by a hidden
# case of test_resnet50), the same as tensorflow_datasets writes it, and the same with a truncated JPEG (an error naming it), a 2-rank fp16 run (mixed precision, emulated on the CPU), and the
# clear errors for a bad --dtype and a missing --data_dir; a diverged run stops with an error;
# an earlier run's --model_dir is replaced only with --overwrite; without
# --synthetic_eval_samples the evaluation is proportionate to what is trained; --data_format
# channels_last gives channels_first's loss; --resume continues a run bitwise (also one cut inside an epoch by --train_steps), and is refused
# without --enable_checkpoint_and_export or with --overwrite; --profile_steps leaves a trace
# of its steps in the TensorBoard directory (none with 0), and --enable_time_history prints
# the images/s of each --log_steps interval.
foreach(_case synthetic_2_ranks log_steps micro_batch_of_one imagenet_folders imagenet_tfds truncated_jpeg dtype_fp16_2_ranks dtype_bad missing_data_dir diverged
              existing_model_dir synthetic_eval_default data_format resume resume_mid_epoch resume_refused profile_steps
              memory_estimate imagenet_val_classes)
  add_test(NAME resnet50.launcher.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/resnet50_launcher.sh
                   $<TARGET_FILE:tarantella_launcher> $<TARGET_FILE:resnet50> ${_case}
                   $<TARGET_FILE:test_resnet50>)
  set_tests_properties(resnet50.launcher.${_case} PROPERTIES
                       TIMEOUT 180 LABELS e2e
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endforeach()
# 26 training steps (to train more than 25 global batches' worth, so that the proportion
# gives more than one batch) and a 2-step run.
set_tests_properties(resnet50.launcher.synthetic_eval_default PROPERTIES TIMEOUT 300)
# A history.csv that can no longer be written (RLIMIT_FSIZE, as a full disk) ends the run with
# an error naming it (history_write_fails.sh).
add_test(NAME resnet50.history_write_fails
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/history_write_fails.sh $<TARGET_FILE:resnet50>)
set_tests_properties(resnet50.history_write_fails PROPERTIES TIMEOUT 300 LABELS e2e ENVIRONMENT TNT_NUM_THREADS=1)
# --micro_batch_size on 2 and 3 ranks (resnet50_micro_batch.sh): the global batch is micro x
# ranks (the same history as --batch_size of that), disagreeing flags refused naming both.
foreach(_np 2 3)
  add_test(NAME resnet50.micro_batch_size.np${_np}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/resnet50_micro_batch.sh $<TARGET_FILE:tarantella_launcher>
                   $<TARGET_FILE:resnet50> ${_np})
  set_tests_properties(resnet50.micro_batch_size.np${_np} PROPERTIES
                       TIMEOUT 300 LABELS e2e PROCESSORS ${_np}
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endforeach()
