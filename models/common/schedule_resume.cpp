#include "common/schedule_resume.hpp"
#include "common/wording.hpp"

#include "tarantella/tarantella.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tnt_models {

ShiftedSchedule::ShiftedSchedule(tnt::SchedulePtr inner, int64_t offset) : inner_(std::move(inner)), offset_(offset) {
  TNT_CHECK(inner_ != nullptr, "ShiftedSchedule: null schedule");
}

double ShiftedSchedule::lr(int64_t step) const { return inner_->lr(std::max<int64_t>(0, step + offset_)); }

std::string ShiftedSchedule::describe() const {
  return fmt::format("{}, read {} step{} {}", inner_->describe(), offset_ < 0 ? -offset_ : offset_,
                     offset_ == 1 || offset_ == -1 ? "" : "s", offset_ < 0 ? "back" : "on");
}

int64_t align_schedule_to_epochs(tnt::Model& model, const tnt::SchedulePtr& schedule, int initial_epoch,
                                 int64_t steps_per_epoch) {
  const int64_t step = model.global_step();
  const int64_t at = static_cast<int64_t>(initial_epoch) * steps_per_epoch + model.checkpoint_epoch_step();
  const int64_t offset = at - step;
  if (offset == 0) return 0;
  model.optimizer().set_schedule(std::make_shared<ShiftedSchedule>(schedule, offset));
  tnt::print("The checkpoint's step {} is epoch {}{} of the learning-rate schedule at {} an epoch (another number "
             "of steps an epoch than it was trained with: another global batch or data): the schedule goes on from its "
             "step {}, as if trained so from the start",
             step, initial_epoch,
             model.checkpoint_epoch_step() > 0 ? " and " + count_of(model.checkpoint_epoch_step(), "step") : "",
             count_of(steps_per_epoch, "step"), at);
  return offset;
}

}  // namespace tnt_models
