# fashion_mnist through the launcher on 2 ranks: bad input ends with a clear message and a
# non-zero exit, never a hang; progress and files come from the master once. Each test is a
# bash script that starts the job itself (it needs the launcher, not a bare mpirun).
# The launcher's target is tarantella_launcher: the runtime library owns the name tarantella.
if(NOT TARGET fashion_mnist OR NOT TARGET tarantella_launcher)
  return()
endif()

set(_fm_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
set(_fm_bins $<TARGET_FILE:tarantella_launcher> $<TARGET_FILE:fashion_mnist>)

foreach(_case missing_data_dir truncated_gzip truncated_idx corrupt_gzip batch_smaller_than_ranks
              micro_batch_mismatch checkpoint_other_model micro_batch_uneven negative_micro_batch too_many_train_samples
              resume_other_seed checkpoint_negative_epoch label_out_of_range wrong_image_size
              checkpoint_negative_step empty_test_set gzip_bomb resume_other_batch
              ranks_disagree timeline_directory newer_checkpoint)
  add_test(NAME fashion_mnist.bad_input.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fashion_mnist_bad_input.sh ${_fm_bins} ${_case})
  # The scripts' own guard (TNT_E2E_TIMEOUT, 60 s a run) ends a hang first; this is the
  # backstop for the whole script (up to two runs).
  set_tests_properties(fashion_mnist.bad_input.${_case} PROPERTIES
                       TIMEOUT 240 ENVIRONMENT "${_fm_env}" LABELS e2e)
endforeach()

# What a run leaves in --model_dir when it goes wrong (fashion_mnist_model_dir.sh): a
# diverged run keeps the last good checkpoint; history.csv has each epoch once (written by
# the master alone, cut back to the checkpoint's epoch on --resume); a trained model is
# replaced only with --overwrite; a run interrupted before its first checkpoint is not
# offered --resume; a --resume with nothing to train evaluates the test set, also below the
# checkpoint's epoch; --overwrite removes the earlier run's TensorBoard events (nothing else);
# --resume with a --model_dir that does not exist creates nothing; without --model_dir each run
# has its own directory; nothing is written or removed through a link; a directory in use is
# refused naming its run's process; a resumed history must fit its header, or is said missing;
# a --model_dir that only the master's host has resumes (the master reads the checkpoint) as
# one every rank sees; SIGUSR1 (a batch system's warning) stops a run after a step with a checkpoint that --resume=auto continues bitwise; --resume=auto
# starts, continues or starts over as the directory says; a restart of a launch whose directory
# another run took since its first attempt is refused, not continued or overwritten.
foreach(_case diverged output_on_all_devices resume_after_crash existing_model_dir interrupted_first_epoch
        resume_nothing_to_train resume_below_checkpoint overwrite_tensorboard resume_missing_model_dir
        default_run_dirs overwrite_symlinked_train dangling_history_link fifo_checkpoint early_warning_signal concurrent_runs resume_other_columns
        resume_missing_history resume_master_only_dir warning_signal resume_auto restart_taken_over)
  add_test(NAME fashion_mnist.model_dir.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fashion_mnist_model_dir.sh ${_fm_bins} ${_case})
  set_tests_properties(fashion_mnist.model_dir.${_case} PROPERTIES
                       TIMEOUT 240 ENVIRONMENT "${_fm_env}" LABELS e2e)
endforeach()

# VERBOSE EPOCHS: the line-per-epoch mode, the progress-bar mode with stdout not a
# terminal, and two epochs for two rows in history.csv.
foreach(_run "2;1" "1;1" "2;2")
  list(GET _run 0 _verbose)
  list(GET _run 1 _epochs)
  set(_name fashion_mnist.master_output.verbose${_verbose}_epochs${_epochs})
  add_test(NAME ${_name}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fashion_mnist_master_output.sh ${_fm_bins} ${_verbose} ${_epochs})
  set_tests_properties(${_name} PROPERTIES TIMEOUT 150 ENVIRONMENT "${_fm_env}" LABELS e2e)
endforeach()

# On a terminal (script(1), 60 columns): the bar fits the width the launcher passes on, the
# evaluation is announced with its own bar, the epoch line times training and evaluation
# apart; SIGINT to the launcher ends the bar's line and the job (exit status 130).
add_test(NAME fashion_mnist.terminal
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fashion_mnist_terminal.sh ${_fm_bins})
set_tests_properties(fashion_mnist.terminal PROPERTIES TIMEOUT 200 ENVIRONMENT "${_fm_env}" LABELS e2e)

# --strategy=parameter_server through --parameter-servers (fashion_mnist_parameter_server.sh):
# staleness 0 equals synchronous, asynchronous accuracy near it, checkpoints resumed across
# the two modes, bad role plans refused before anything starts, a stopped or killed server named,
# a killed worker dropped, a killed server restarted from the checkpoint.
foreach(_case staleness0 async resume_across bad_roles server_stopped server_killed worker_killed server_restart
              worker_lost_at_start last_worker_lost first_worker_killed heartbeat_off
              timeline)
  add_test(NAME fashion_mnist.parameter_server.${_case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fashion_mnist_parameter_server.sh ${_fm_bins} ${_case})
  set_tests_properties(fashion_mnist.parameter_server.${_case} PROPERTIES
                       TIMEOUT 240 ENVIRONMENT "${_fm_env}" LABELS "e2e;ps" PROCESSORS 2)
endforeach()
# async: six runs of 4 epochs (about 10 s each alone, 20-30 s at a load average of 10-15).
set_tests_properties(fashion_mnist.parameter_server.async PROPERTIES TIMEOUT 420)

# TNT_CUDA_PROFILE_STEPS where it cannot apply (a CPU rank: a warning) and where it is
# malformed (exit status 2, the variable named).
add_test(NAME fashion_mnist.cuda_profile_steps
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda_profile_steps.sh $<TARGET_FILE:fashion_mnist>)
set_tests_properties(fashion_mnist.cuda_profile_steps PROPERTIES TIMEOUT 300 ENVIRONMENT "${_fm_env}" LABELS e2e)
