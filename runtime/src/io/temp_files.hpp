// Temporary files of atomic rewrites (write a temp beside the file, then rename): their
// names carry the writing process's id, so that a later write can remove those of writers
// that died before their rename (a SIGKILL mid-write) without touching a live writer's.
// Used by the safetensors writer and the CSVLogger's history rewrite.
#pragma once

#include <filesystem>
#include <string>

namespace tnt::io {

// ".<base>.tmp-<pid>-XXXXXX" in `dir`: a template for mkstemp.
std::string temp_template(const std::filesystem::path& dir, const std::string& base);

// The file mode creation mask, read without changing it (umask(2) can only set it, and
// setting it back races with other threads creating files): /proc/self/status's Umask.
// 022 where that cannot be read.
unsigned current_umask() noexcept;

// Removes the temporary files of earlier writes of `base` in `dir` whose process is gone.
// Best effort: the file itself is already in place, so a failure here is not one.
void remove_stale_temps(const std::filesystem::path& dir, const std::string& base) noexcept;

}  // namespace tnt::io
