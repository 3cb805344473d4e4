// Checks of a resume that read the checkpoint's metadata (resume_checks.cpp).
#pragma once

#include "common/flags.hpp"

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace tnt_models {

// The "__metadata__" of a safetensors file's JSON header (checkpoint.hpp: an 8-byte
// little-endian length, then the JSON); empty when the header cannot be read.
nlohmann::json checkpoint_metadata(const std::string& path);

// A checkpoint written inside an epoch (metadata epoch_step > 0) and `given` flags of
// RunFlags::same_inside_epoch whose values differ from `stored` (the checkpoint's flags):
// throws InputError naming them.
void check_inside_epoch(const std::string& checkpoint, const nlohmann::json& metadata, const std::string& stored,
                        const RunFlags& given);

}  // namespace tnt_models
