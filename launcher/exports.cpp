#include "exports.hpp"

#include "env_names.hpp"
#include "text.hpp"

#include <algorithm>

namespace tnt::launcher {

std::vector<EnvVar> rank_exports(const Options& options, const Environment& env) {
  std::vector<EnvVar> out{{env::launcher, "1"}};
  if (options.fusion_threshold_kb) out.emplace_back(env::fusion_threshold, std::to_string(*options.fusion_threshold_kb));
  if (options.fusion_threshold_auto) out.emplace_back(env::fusion_threshold, "auto");
  if (options.log_level) out.emplace_back(env::log_level, *options.log_level);
  if (options.output_on_all_devices) out.emplace_back(env::output_on_all_devices, "1");
  if (options.log_on_all_devices) out.emplace_back(env::log_on_all_devices, "1");

  auto set_already = [&](const std::string& name) {
    return std::any_of(out.begin(), out.end(), [&](const EnvVar& e) { return e.first == name; });
  };
  auto in_x = [&](const std::string& name) {
    return std::any_of(options.exports.begin(), options.exports.end(), [&](const EnvVar& e) { return e.first == name; });
  };
  // std::map iterates in name order, which keeps the command stable.
  for (const auto& [name, value] : env) {
    if (!starts_with(name, env::prefix) || env::is_reserved(name)) continue;
    if (set_already(name) || in_x(name)) continue;
    out.emplace_back(name, value);
  }
  for (const auto& e : options.exports) out.push_back(e);
  return out;
}

}  // namespace tnt::launcher
