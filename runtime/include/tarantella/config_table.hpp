// The names of every TNT_* variable, in one place for the runtime and the launcher (which
// includes this header only: it is macros and constants, with no dependency):
//   TNT_CONFIG_KNOBS      the runtime's tunables (tarantella/config.hpp reads them into Config)
//   TNT_LAUNCH_VARIABLES  what the launcher sets for each rank or reads itself (not knobs)
// and tnt::env::<name> for each of them, so no other file spells a name again.
#pragma once

namespace tnt {

// X(field, type, ENV, default, unit, help); FusionThresholdKb is defined in tarantella/config.hpp,
// the one place the types are used.
#define TNT_CONFIG_KNOBS(X)                                                                     \
  X(fusion_threshold_kb, FusionThresholdKb, "TNT_FUSION_THRESHOLD", 32, "KB",                   \
    "gradient fusion bucket size; 0 = one bucket per tensor; auto = chosen by the scaling model after the first steps") \
  X(allreduce_algo, std::string, "TNT_ALLREDUCE_ALGO", "", "",                                 \
    "ring|mpi|nccl; empty = ring for host buffers, nccl for device buffers")                   \
  X(collective_timeout_s, double, "TNT_COLLECTIVE_TIMEOUT", 600.0, "s",                         \
    "a collective not complete after this long fails on the waiting ranks; 0 = never")        \
  X(log_level, std::string, "TNT_LOG_LEVEL", "WARNING", "", "DEBUG|INFO|WARNING|ERROR")         \
  X(output_on_all_devices, bool, "TNT_OUTPUT_ON_ALL_DEVICES", false, "",                        \
    "progress output from every rank, not only the master (files: the master's only)")         \
  X(log_on_all_devices, bool, "TNT_LOG_ON_ALL_DEVICES", false, "", "log lines from every rank")  \
  X(timeline, std::string, "TNT_TIMELINE", "", "", "Chrome trace file of a window of steps; empty = off") \
  X(timeline_steps, std::string, "TNT_TIMELINE_STEPS", "1-10", "steps",                         \
    "the timeline's window a-b (1-based, over the whole run); unset = this run's first 10 steps")  \
  X(cuda_profile_steps, std::string, "TNT_CUDA_PROFILE_STEPS", "", "steps",                    \
    "steps a-b between cudaProfilerStart and cudaProfilerStop, for nsys/ncu with capture by the profiler API; empty = off") \
  X(profile_scaling, std::string, "TNT_PROFILE_SCALING", "", "",                               \
    "write a scaling profile (docs/scaling.md) to this file after warm-up; empty = off")       \
  X(profile_scaling_steps, int64_t, "TNT_PROFILE_SCALING_STEPS", 30, "steps",                   \
    "steps the scaling profile takes its medians over, after 5 warm-up steps and 5 one-bucket steps (several ranks)") \
  X(deterministic, bool, "TNT_DETERMINISTIC", false, "", "deterministic kernels only")          \
  X(device, std::string, "TNT_DEVICE", "", "",                                                 \
    "cpu or cuda:K (set by the launcher); empty = cuda:local_rank, cpu without a GPU or where the node runs more ranks than GPUs") \
  X(num_threads, int64_t, "TNT_NUM_THREADS", 0, "threads",                                     \
    "CPU compute threads per rank; 0 = the rank's share of its node's cores (its affinity mask's cores, each shared by k local ranks' masks counted 1/k)")                 \
  X(ring_segment_kb, int64_t, "TNT_RING_SEGMENT", 256, "KB",                                    \
    "segment size of the ring allreduce pipeline")                                            \
  X(fused_attention_stored_ds, bool, "TNT_FUSED_ATTENTION_STORED_DS", false, "",                 \
    "fused attention backward: the dK/dV kernel stores dS for the dQ kernel (one product a tile instead of three; B*H*Tq*Tk more memory while it runs); 0 = the dQ kernel computes dS again") \
  X(cudnn_autotune, bool, "TNT_CUDNN_AUTOTUNE", true, "",                                       \
    "time cuDNN's convolution algorithms once per shape; 0 = cuDNN's heuristics")              \
  X(cudnn_conv_graph, bool, "TNT_CUDNN_CONV_GRAPH", true, "",                                 \
    "with TNT_CUDNN_AUTOTUNE, f16/bf16 convolutions on CUDA also time the engine configs of cuDNN's graph API (checked against the algorithm's results) and run the fastest; 0 = cuDNN's legacy algorithms only") \
  X(conv_pad_channels, std::string, "TNT_CONV_PAD_CHANNELS", "auto", "",                       \
    "channels_last Conv2D on CUDA with 1-3 input channels (images): auto = widen them with zero channels to 4 or 8 where the timed algorithms are faster (with TNT_CUDNN_AUTOTUNE; else never); 0 = never; 4 or 8 = always") \
  X(pinned_staging, bool, "TNT_PINNED_STAGING", true, "",                                       \
    "copy GPU inputs through page-locked buffers on a copy stream; 0 = plain copies")          \
  X(ps_servers, std::string, "TNT_PS_SERVERS", "", "ranks",                                    \
    "server ranks of parameter-server training, e.g. 0,1 (the launcher's --parameter-servers); empty = rank 0") \
  X(ps_worker_timeout_s, double, "TNT_PS_WORKER_TIMEOUT", 0.0, "s",                             \
    "parameter-server training: a worker silent this long is dropped, its samples go to the others (the launcher sets it from --heartbeat-timeout); 0 = never") \
  X(fused_attention, bool, "TNT_FUSED_ATTENTION", true, "",                                     \
    "fused CUDA attention (bf16/fp16, head depth 16..128 in steps of 16; else unfused); 0 = cuBLAS products around a softmax kernel") \
  X(cudnn_attention, AutoSwitch, "TNT_CUDNN_ATTENTION", AutoSwitch::Mode::automatic, "",          \
    "CUDA attention core through cuDNN's fused flash attention (bf16/fp16, head depth 8..128 in steps of 8, causal only self-attention): auto = per shape, where its first use finds cuDNN's results agreeing with the fused/unfused engine's and its forward+backward 2% faster; 1 = wherever its graph builds; 0 = never. Shapes whose graph does not build or whose forward fails to run take the fused/unfused engines") \
  X(gemm_pad, AutoSwitch, "TNT_GEMM_PAD", AutoSwitch::Mode::automatic, "",                          \
    "CUDA f16/bf16 output projection (Embedding's, or a Dense layer's units) over a vocabulary that is not a multiple of 8 (its rows off the 16-byte boundary cuBLAS's Hopper kernels need): auto = per shape, padded with zero rows to a multiple of 8 where its first use finds the padded products agreeing with the direct ones and 2% faster, each direction apart; 1 = always padded; 0 = never (and auto in deterministic mode)") \
  X(fused_attention_rows, int64_t, "TNT_FUSED_ATTENTION_ROWS", 16, "rows",                    \
    "query rows per warp of the fused attention forward: 16, or 32 (blocks of 128 rows; head depths up to 64, 16 above); the same results") \
  X(cuda_sync_check, bool, "TNT_CUDA_SYNC_CHECK", false, "",                                 \
    "CUDA: after each layer's forward and backward the host waits for the GPU and checks for an error, so that a failing kernel is named with its layer (slow: for finding faults)") \
  X(cuda_early_readback, bool, "TNT_CUDA_EARLY_READBACK", true, "",                           \
    "CUDA: a step's results (loss, metric counts) are copied back as soon as the loss is computed, and the step's readback waits for that copy alone, not for the backward; 0 = the readback waits for the whole step (the same results)") \
  X(cuda_batched_spans, bool, "TNT_CUDA_BATCHED_SPANS", true, "",                             \
    "CUDA: zero_grad and the weights' f16/bf16 copies in one launch per device; 0 = one memset or cast per parameter (the same bits)") \
  X(loss_grad_in_place, bool, "TNT_LOSS_GRAD_IN_PLACE", true, "",                              \
    "the label-smoothed loss writes its gradient over the predictions when nothing else holds them (the Transformer's logits: 2.2 GB less at its tutorial batch); 0 = into a buffer of its own (the same bits)") \
  X(cpu_bf16, AutoSwitch, "TNT_CPU_BF16", AutoSwitch::Mode::automatic, "",                        \
    "bf16 mixed precision on CPU ranks: auto = Conv2D and Dense multiply bf16 activations by bf16 weights (oneDNN, f32 sums) where the CPU has AVX512-BF16 or AMX, other layers compute in f32; 1 = so on any CPU oneDNN serves (slow without those instructions); 0 = every layer computes in f32 between bf16 activations") \
  X(layer_fusion, bool, "TNT_LAYER_FUSION", true, "",                                           \
    "chains of layers run as one call where an engine takes them: on GPUs BatchNorm->ReLU, BatchNorm->Add->ReLU (cuDNN) and Dropout->Add; on CPUs the same BatchNorm chains (oneDNN), Dropout->Add and ReLU->MaxPool2D 2x2; 0 = layer by layer")

// X(name, ENV, help): set by the launcher for each rank, or read by the launcher itself.
#define TNT_LAUNCH_VARIABLES(X)                                                                 \
  X(rank, "TNT_RANK", "this rank (the per-rank step, from Open MPI)")                            \
  X(size, "TNT_SIZE", "the number of ranks")                                                    \
  X(local_rank, "TNT_LOCAL_RANK", "this rank's index on its host")                              \
  X(local_size, "TNT_LOCAL_SIZE", "ranks on this host")                                         \
  X(numa_node, "TNT_NUMA_NODE", "the NUMA node a pinned rank runs on")                          \
  X(launcher, "TNT_LAUNCHER", "1: started by the launcher")                                     \
  X(stdout_is_tty, "TNT_STDOUT_IS_TTY",                                                         \
    "1/0: whether the launcher's stdout is a terminal (a rank's is a pseudo-terminal either way)") \
  X(start_timeout, "TNT_START_TIMEOUT", "seconds by which every rank must have started")        \
  X(exit_timeout, "TNT_EXIT_TIMEOUT", "seconds the job may take to end once a rank ended")      \
  X(heartbeat_timeout, "TNT_HEARTBEAT_TIMEOUT", "seconds without a heartbeat: unreachable")     \
  X(restart, "TNT_RESTART", "the attempt: 0, then n for the n-th restart")                      \
  X(run_id, "TNT_RUN_ID", "the launcher run, the same over its restarts")                       \
  X(report_address, "TNT_LAUNCHER_REPORT", "where a rank's step reports (private to the launcher)") \
  X(join_fd, "TNT_JOIN_FD", "a pipe on which the runtime says it entered and left MPI_Init")    \
  X(core_limit, "TNT_CORE_LIMIT",                                                               \
    "the launcher's core file size limit, for the rank's program (mpirun itself runs without)")  \
  X(scontrol, "TNT_SCONTROL", "the scontrol that --requeue runs (default: scontrol on PATH)")

namespace env {
#define TNT_ENV_KNOB_NAME(field, type, name, def, unit, help) inline constexpr const char* field = name;
TNT_CONFIG_KNOBS(TNT_ENV_KNOB_NAME)
#undef TNT_ENV_KNOB_NAME
#define TNT_ENV_LAUNCH_NAME(field, name, help) inline constexpr const char* field = name;
TNT_LAUNCH_VARIABLES(TNT_ENV_LAUNCH_NAME)
#undef TNT_ENV_LAUNCH_NAME
}  // namespace env

}  // namespace tnt
