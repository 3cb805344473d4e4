// watch_limits() of cli.hpp: the job's time limits from the options, else the environment,
// else the defaults.
#include "cli.hpp"
#include "env_names.hpp"
#include "error.hpp"
#include "text.hpp"

#include <fmt/format.h>

namespace tnt::launcher {

namespace {

Seconds resolve(std::optional<double> flag_value, const Environment& env, const char* variable, double fallback) {
  if (flag_value) return Seconds(*flag_value);
  if (auto text = lookup(env, variable)) {
    if (auto v = parse_seconds(*text)) return Seconds(*v);
    throw InputError(fmt::format("{}='{}' is not a number of seconds from 0 (no limit) to a year (31622400)", variable,
                                 *text));
  }
  return Seconds(fallback);
}

}  // namespace

WatchLimits watch_limits(const Options& options, const Environment& env) {
  WatchLimits l;
  l.start = resolve(options.start_timeout_s, env, env::start_timeout, default_start_timeout_s);
  l.exit = resolve(options.exit_timeout_s, env, env::exit_timeout, default_exit_timeout_s);
  l.heartbeat = resolve(options.heartbeat_timeout_s, env, env::heartbeat_timeout, default_heartbeat_timeout_s);
  if (l.heartbeat.count() > 0 && l.heartbeat.count() < 1) {
    throw InputError(fmt::format("heartbeat timeout {} s (--heartbeat-timeout, {}): must be 0 (off) or at least 1 s",
                                 format_seconds(l.heartbeat), env::heartbeat_timeout));
  }
  return l;
}

}  // namespace tnt::launcher
