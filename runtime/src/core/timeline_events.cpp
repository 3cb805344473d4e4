#include "core/timeline_events.hpp"

#include "core/context.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tnt::timeline {

Events* active() {
  RuntimeContext* c = context_or_null();
  if (!c || !c->timeline) return nullptr;
  return c->timeline->recording() ? c->timeline.get() : nullptr;
}

std::string escape(std::string_view text) {
  const bool plain = std::none_of(text.begin(), text.end(), [](char c) {
    return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20;
  });
  if (plain) return std::string(text);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

void Span::begin(Lane lane, std::string_view name, std::string args, bool device) {
  lane_ = lane;
  name_ = name;
  args_ = std::move(args);
  t0_ = detail::now_s();
  if (device) device_begin_ = recorder_->device_mark();
}

void Span::end() {
  const double t1 = detail::now_s();
  if (device_begin_) recorder_->device_span(Lane::gpu_compute, name_, device_begin_, recorder_->device_mark(), args_);
  recorder_->add(lane_, std::move(name_), "tarantella", t0_, t1, std::move(args_));
}

}  // namespace tnt::timeline
