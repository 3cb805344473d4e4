// Everything a training program needs.
#pragma once

#include "tarantella/check.hpp"
#include "tarantella/comm.hpp"
#include "tarantella/config.hpp"
#include "tarantella/device.hpp"
#include "tarantella/dtype.hpp"
#include "tarantella/log.hpp"
#include "tarantella/runtime.hpp"
#include "tarantella/tensor.hpp"
