// Every layer, loss and metric.
#pragma once

#include "tarantella/layer.hpp"
#include "tarantella/layers/activation.hpp"
#include "tarantella/layers/add.hpp"
#include "tarantella/layers/attention.hpp"
#include "tarantella/layers/batch_norm.hpp"
#include "tarantella/layers/conv2d.hpp"
#include "tarantella/layers/dense.hpp"
#include "tarantella/layers/dropout.hpp"
#include "tarantella/layers/embedding.hpp"
#include "tarantella/layers/flatten.hpp"
#include "tarantella/layers/layer_norm.hpp"
#include "tarantella/layers/pooling.hpp"
#include "tarantella/layers/position_encoding.hpp"
#include "tarantella/loss.hpp"
#include "tarantella/metrics.hpp"
#include "tarantella/ops.hpp"
