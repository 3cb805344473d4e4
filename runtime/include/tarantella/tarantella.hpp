// Everything a training program needs.
#pragma once

// Said first, before the headers' own errors: a compiler in C++17 mode (g++ 12's default)
// otherwise reports concepts and std::span as unrelated failures.
#if __cplusplus < 202002L
#error "tarantella needs C++20: compile with -std=c++20 (or newer); CMake's tarantella::tarantella target asks for it"
#endif

#include "tarantella/callbacks.hpp"
#include "tarantella/check.hpp"
#include "tarantella/checkpoint.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/config.hpp"
#include "tarantella/dataset.hpp"
#include "tarantella/device.hpp"
#include "tarantella/dtype.hpp"
#include "tarantella/files.hpp"
#include "tarantella/graph.hpp"
#include "tarantella/idx.hpp"
#include "tarantella/imagenet.hpp"
#include "tarantella/initializers.hpp"
#include "tarantella/layer.hpp"
#include "tarantella/layers.hpp"
#include "tarantella/log.hpp"
#include "tarantella/loss.hpp"
#include "tarantella/metrics.hpp"
#include "tarantella/model.hpp"
#include "tarantella/model_io.hpp"
#include "tarantella/optim.hpp"
#include "tarantella/precision.hpp"
#include "tarantella/random.hpp"
#include "tarantella/reducer.hpp"
#include "tarantella/runtime.hpp"
#include "tarantella/schedule.hpp"
#include "tarantella/tensor.hpp"
