// The POSIX steps that make a file survive a crash: fsync the file so its bytes are on
// disk, rename it into place (atomic within one directory), then fsync the directory so
// the rename itself is on disk. Every failure names the path and errno's text.
#pragma once

#include <filesystem>
#include <string>

namespace troupe::checkpoint::detail {

void fsync_path(const std::filesystem::path& path);  // a file or a directory
// rename(2) from -> to, then fsync to's directory.
void durable_rename(const std::filesystem::path& from, const std::filesystem::path& to);
// Replaces `path` with `text`, never leaving it half written: temp file, fsync, rename.
void write_text_durably(const std::filesystem::path& path, const std::string& text);

}  // namespace troupe::checkpoint::detail
