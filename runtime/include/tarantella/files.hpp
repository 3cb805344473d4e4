// Files a user names (data, vocabularies, translation sources and references, checkpoints,
// histories) are read only when they are regular files: /dev/zero would be read without end,
// a FIFO blocks the open until some writer comes, a directory reads as nothing. Every reader
// of such a file opens it through here, so each refusal names the file and what it was for.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace tnt {

// The size in bytes of the regular file at `path` (symbolic links followed). Throws
// InputError "<what> '<path>': no such file" or "...: not a regular file (a FIFO)" and the
// like; `what` says what the file is for ("vocabulary", "IDX file", "--bleu_source").
uint64_t check_regular_file(const std::string& path, std::string_view what);

// check_regular_file, then the file opened for reading in binary mode (InputError with the
// system's reason when it cannot be opened).
std::ifstream open_regular_file(const std::string& path, std::string_view what);

// A text file opened by open_regular_file, past a UTF-8 byte-order mark (EF BB BF) at its
// start if it has one: Windows editors and Excel's "CSV UTF-8" write one, and it would
// otherwise stick to the first field, subtoken or word, unseen in any message.
std::ifstream open_text_file(const std::string& path, std::string_view what);

// Writes `content` to `path` whole or not at all: into a new temporary file beside it
// (created exclusively, so no link placed there is followed), synced, then renamed over
// `path` (which replaces a link at `path`, not its target). A failure (a full disk, a
// file-size limit) is an InputError "<what> '<path>': ..." and leaves `path` as it was.
void write_file_atomically(const std::string& path, std::string_view content, std::string_view what);

}  // namespace tnt
