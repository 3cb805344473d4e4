// A learning-rate schedule defined in epochs, continued by a resumed run whose global batch
// differs from the checkpoint's (a new --batch_size, or more ranks at the same micro-batch).
//
// The optimizer's step counter comes back from the checkpoint in the old run's steps; the
// schedule was built from the new steps per epoch. Unaligned, a run resumed after 10
// epochs at twice the batch is at "epoch 20" of the schedule: its decay after epoch 30
// came 10 epochs early, its warmup jumped. Aligned, step s of the resumed run reads the
// schedule at s + offset, where the checkpoint's step falls on its epoch (and its steps
// into that epoch) at the new steps per epoch. Same batch: offset 0, the same bits.
#pragma once

#include "tarantella/schedule.hpp"

#include <cstdint>
#include <memory>

namespace tnt {
class Model;
}

namespace tnt_models {

// The schedule read `offset` steps on (never before step 0).
class ShiftedSchedule : public tnt::LearningRateSchedule {
 public:
  ShiftedSchedule(tnt::SchedulePtr inner, int64_t offset);
  double lr(int64_t step) const override;
  std::string describe() const override;
  int64_t offset() const { return offset_; }

 private:
  tnt::SchedulePtr inner_;
  int64_t offset_;
};

// After resume_from_checkpoint: where the checkpoint's step (model.global_step()) is not
// epoch `initial_epoch` (plus the checkpoint's steps into it) at `steps_per_epoch`, the
// model's optimizer gets `schedule` shifted to match, and the master says so. Returns the
// offset (0: nothing changed).
int64_t align_schedule_to_epochs(tnt::Model& model, const tnt::SchedulePtr& schedule, int initial_epoch,
                                 int64_t steps_per_epoch);

}  // namespace tnt_models
