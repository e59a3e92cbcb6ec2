// The constants of the checkpoint file format (docs/CHECKPOINT_FORMAT.md describes it
// in full). A reader accepts any file whose format is "troupe-checkpoint" and whose
// major version it knows; minor versions only ever add things a reader may ignore.
#pragma once

#include <cstdint>
#include <string_view>

namespace troupe::checkpoint {

inline constexpr std::string_view kFormatName = "troupe-checkpoint";
// "major.minor": a reader refuses a major it does not know and accepts any minor.
// 2.0 stores strings fixed-length; 1.x stored them variable-length and is still read.
inline constexpr std::string_view kFormatVersion = "2.0";
inline constexpr int kFormatMajor = 2;
inline constexpr int kOldestFormatMajor = 1;

// Attribute names.
inline constexpr std::string_view kAttrFormat = "format";
inline constexpr std::string_view kAttrFormatVersion = "format_version";
// On every dataset: the element type by troupe name (f32, bf16, ...), and the XXH64
// (seed 0) of its raw little-endian bytes in C order.
inline constexpr std::string_view kAttrDType = "dtype";
inline constexpr std::string_view kAttrChecksum = "xxh64";
// Root attribute written last, just before the file is closed: a file without it was
// cut short while being written.
inline constexpr std::string_view kAttrComplete = "complete";

}  // namespace troupe::checkpoint
