// What a collective is part of, and where no collective may start. Both are per thread (the
// thread that runs the training loop; the Reducer's communication thread has neither).
//
// CollectiveLabel names the runtime call that issues collectives ("save_weights",
// "save_checkpoint"), so that messages and the arrival channel say "broadcast(root 0, 1 x
// i64, cpu) in save_weights" rather than a bare broadcast.
//
// SomeRanksRegion marks code that runs on some ranks only: a callback that is not
// Ranks::all. A collective started inside it would wait for ranks that never call it; it
// throws InputError at once on this rank instead, naming the call, the region and the fix.
#pragma once

#include <string>

namespace tnt::detail {

class CollectiveLabel {
 public:
  // what: a literal (the arrival channel keeps the pointer). Refuses (throws) inside a
  // SomeRanksRegion, before the labelled call has done anything.
  explicit CollectiveLabel(const char* what);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  const char* previous_;
};

class SomeRanksRegion {
 public:
  // where: "callback 'MyCheckpoint'"; runs_on: "the master only (Ranks::master_only)". Both
  // must outlive the region (it is entered once per hook: nothing is copied).
  SomeRanksRegion(const std::string& where, const char* runs_on);
  ~SomeRanksRegion();
  SomeRanksRegion(const SomeRanksRegion&) = delete;
  SomeRanksRegion& operator=(const SomeRanksRegion&) = delete;

 private:
  const SomeRanksRegion* previous_;
  const std::string& where_;
  const char* runs_on_;
  friend void refuse_collective_here(const std::string& call);
// Throws InputError when this thread is inside a SomeRanksRegion: call names a change that
// every rank's replica must make alike (a learning rate), which would make them drift apart.
void refuse_replica_change_here(const std::string& call);
  friend void refuse_replica_change_here(const std::string& call);
};

// The innermost CollectiveLabel of this thread, or nullptr.
const char* current_collective_label();
bool inside_some_ranks_region();
// Throws InputError when this thread is inside a SomeRanksRegion: call names the collective.
void refuse_collective_here(const std::string& call);
// Throws InputError when this thread is inside a SomeRanksRegion: call names a change that
// every rank's replica must make alike (a learning rate), which would make them drift apart.
void refuse_replica_change_here(const std::string& call);

// The callback's class name as a reader knows it: demangled, without "tnt::" or an
// anonymous namespace.
std::string readable_type_name(const char* mangled);

}  // namespace tnt::detail
