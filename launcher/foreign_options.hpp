// Options of other launchers (mpirun, horovodrun, torchrun, srun) that users type out of
// habit: for each, what does the same here, so that "no such option" is never the last word.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tnt::launcher {

// `word` as written ("--map-by", "-mca", "--nproc_per_node=4", "-p"); the hint without the
// option's name ("torchrun's ranks per node: -n N here"), or nothing for a word no other
// launcher takes.
std::optional<std::string> foreign_option_hint(std::string_view word);

}  // namespace tnt::launcher
