// Heuristics -> engine configs -> execution plans (cudnn_graph.hpp): the first plan that
// finalizes (make_plan, make_plan_deviceless), or several to time (make_plans).
#include "backend/cuda/cudnn_graph.hpp"

#include "tarantella/check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace tnt::cuda::graph {

namespace {

// The engine configs heuristics `mode` proposes for op_graph, in its order of preference.
std::vector<Descriptor> engine_configs(const std::string& name, const Descriptor& op_graph,
                                       cudnnBackendHeurMode_t mode, const Descriptor* device_properties) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
                  fmt::format("heuristics mode {} {}", static_cast<int>(mode), name));
  heur.set_desc(TNT_ATTR(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH), op_graph)
      .set(TNT_ATTR(CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (device_properties != nullptr) heur.set_desc(TNT_ATTR(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP), *device_properties);
  heur.finalize();
  int64_t count = 0;
  check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr),
        heur.name() + ": count CUDNN_ATTR_ENGINEHEUR_RESULTS");
  TNT_CHECK(count > 0, "cuDNN graph: {}: no engine config for this graph ({})", heur.name(), last_error_message());
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, fmt::format("engine config {} (mode {}) of {}", i,
                                                                         static_cast<int>(mode), name));
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                 raw.data()),
        heur.name() + ": get CUDNN_ATTR_ENGINEHEUR_RESULTS");
  configs.resize(static_cast<size_t>(std::min(got, count)));
  // cuDNN 9.19 counts results for graphs none of its engines take, then returns none of them
  // (deviceless, e.g. a fused pattern not served on the described GPU): say so, not "0 configs".
  TNT_CHECK(!configs.empty(), "cuDNN graph: {}: heuristics counted {} engine configs but returned none{}", heur.name(),
            count, [] {
              const std::string m = last_error_message();
              return m.empty() ? std::string() : " (" + m + ")";
            }());
  return configs;
}

// The engine of a config (its global index and whether it compiles its kernel at run time
// with NVRTC), best effort: not every cuDNN reports both.
struct EngineInfo {
  int64_t index = -1;
  bool runtime_compiled = false;
};

EngineInfo engine_info(const Descriptor& config, const std::string& what) {
  EngineInfo info;
  Descriptor eng(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine of " + what);
  cudnnBackendDescriptor_t e = eng.get();
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) !=
      CUDNN_STATUS_SUCCESS) {
    return info;
  }
  cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.index);
  cudnnBackendBehaviorNote_t notes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t count = 0;
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &count, notes) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < count && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; ++i)
      info.runtime_compiled = info.runtime_compiled || notes[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  }
  return info;
}

struct Collect {
  size_t max_plans = 1;
  bool skip_runtime_compiled = false;
};

// Execution plans for op_graph with a handle, or (handle null) for the GPU device_properties
// describes: each heuristics mode's configs in order, until c.max_plans have finalized. What
// failed, and why, is appended to `tried`.
std::vector<Plan> collect_plans(const std::string& name, cudnnHandle_t handle, const Descriptor* device_properties,
                                const Descriptor& op_graph, const std::vector<cudnnBackendHeurMode_t>& modes,
                                const Collect& c, std::string& tried, int64_t& total) {
  std::vector<Plan> plans;
  for (cudnnBackendHeurMode_t mode : modes) {
    std::vector<Descriptor> configs;
    try {
      configs = engine_configs(name, op_graph, mode, device_properties);
    } catch (const std::exception& e) {
      tried += fmt::format("\n  heuristics mode {}: {}", static_cast<int>(mode), e.what());
      continue;
    }
    for (size_t i = 0; i < configs.size() && plans.size() < c.max_plans; ++i, ++total) {
      const std::string what = fmt::format("config {} (mode {}) of {}", i, static_cast<int>(mode), name);
      const EngineInfo engine = engine_info(configs[i], what);
      if (c.skip_runtime_compiled && engine.runtime_compiled) {
        tried += fmt::format("\n  mode {} config {} (engine {}): skipped, compiled at run time", static_cast<int>(mode),
                             i, engine.index);
        continue;
      }
      try {
        Plan p;
        p.plan = Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan " + what);
        if (handle != nullptr) p.plan.set_handle(TNT_ATTR(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), handle);
        if (device_properties != nullptr) {
          p.plan.set_desc(TNT_ATTR(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP), *device_properties);
        }
        p.plan.set_desc(TNT_ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), configs[i]);
        p.engine = engine.index;
        p.mode = mode;
        p.config = static_cast<int64_t>(i);
        if (device_properties != nullptr) {
          const cudnnStatus_t st = cudnnBackendFinalize(p.plan.get());
          const std::string last = st == CUDNN_STATUS_SUCCESS ? "" : last_error_message();
          if (st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER &&
              (last.find("LoadData") != std::string::npos || last.find("loadModule") != std::string::npos)) {
            p.compiled_only = true;
            p.engine_config = std::move(configs[i]);  // kept as for a finalized plan (Plan)
            plans.push_back(std::move(p));
            continue;
          }
          if (st != CUDNN_STATUS_SUCCESS) {
            TNT_THROW("cuDNN graph: {}: finalize: {}{}", p.plan.name(), cudnnGetErrorString(st),
                      last.empty() ? "" : " (" + last + ")");
          }
        } else {
          p.plan.finalize();
        }
        int64_t n = 0;
        check(cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                       &n, &p.workspace),
              p.plan.name() + ": get CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");
        p.engine_config = std::move(configs[i]);
        plans.push_back(std::move(p));
      } catch (const std::exception& e) {
        tried += fmt::format("\n  mode {} config {} (engine {}): {}", static_cast<int>(mode), i, engine.index,
                             e.what());
      }
    }
    if (plans.size() >= c.max_plans) break;
  }
  return plans;
}

// make_plan with a handle, or (handle null) for the GPU device_properties describes.
Plan plan_for(const std::string& name, cudnnHandle_t handle, const Descriptor* device_properties,
              const Descriptor& op_graph, const std::vector<cudnnBackendHeurMode_t>& modes) {
  std::string tried;
  int64_t total = 0;
  std::vector<Plan> plans = collect_plans(name, handle, device_properties, op_graph, modes, Collect{}, tried, total);
  if (!plans.empty()) return std::move(plans.front());
  std::vector<int> mode_ids;
  for (cudnnBackendHeurMode_t m : modes) mode_ids.push_back(static_cast<int>(m));
  TNT_THROW("cuDNN graph: {}: none of the {} engine configs of heuristics modes [{}] finalized:{}", name, total,
            fmt::join(mode_ids, ","), tried);
}

}  // namespace

Plan make_plan(const std::string& name, cudnnHandle_t handle, const Descriptor& op_graph,
               const std::vector<cudnnBackendHeurMode_t>& modes) {
  return plan_for(name, handle, nullptr, op_graph, modes);
}

Plan make_plan_deviceless(const std::string& name, const Descriptor& device_properties, const Descriptor& op_graph,
                          const std::vector<cudnnBackendHeurMode_t>& modes) {
  return plan_for(name, nullptr, &device_properties, op_graph, modes);
}

std::vector<Plan> make_plans(const std::string& name, cudnnHandle_t handle, const Descriptor* device_properties,
                             const Descriptor& op_graph, size_t max_plans, std::string* refused,
                             const std::vector<cudnnBackendHeurMode_t>& modes) {
  std::string tried;
  int64_t total = 0;
  std::vector<Plan> plans = collect_plans(name, handle, device_properties, op_graph, modes,
                                          Collect{.max_plans = max_plans, .skip_runtime_compiled = true}, tried, total);
  if (refused != nullptr) *refused = tried;
  return plans;
}

}  // namespace tnt::cuda::graph
