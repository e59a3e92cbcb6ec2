// The pieces every troupe-ckpt subcommand shares: parsed arguments, the exit statuses,
// opening a checkpoint with a message fit for a terminal, and number formatting.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/checkpoint/file_reader.hpp"

namespace troupe::ckpt_tool {

// As diff(1): 0 yes/identical/valid, 1 no/different/invalid, 2 trouble (bad usage,
// missing or unreadable input).
inline constexpr int kOk = 0;
inline constexpr int kNo = 1;
inline constexpr int kTrouble = 2;

struct Args {
  std::string command;
  std::vector<std::string> positional;
  bool json = false;
  bool help = false;
  bool allow_format_1 = false;                 // --allow-format-1: read format 1 files (checkpoint::ReadOptions)
  std::map<std::string, std::string> options;  // --to PATH, --section NAME, --count N
};

// Throws InvalidArgument for an unknown flag or a flag missing its value; `valued` lists
// the flags that take one.
Args parse_args(int argc, char** argv, const std::vector<std::string>& valued);

// How the command opens checkpoints, from its flags.
checkpoint::ReadOptions read_options(const Args& args);

// `message` with control characters written as \xNN: a reason printed on one line, even
// when it quotes something a file (or HDF5 quoting it) put a newline or an escape in.
std::string one_line(std::string_view message);

// "1.5 MB", "48 B".
std::string human_bytes(std::uint64_t bytes);
// "%.6g".
std::string number(double v);
std::string shape_string(const tensor::Shape& shape);

// Resolves a tensor name as a user types it: a full path ("/model/fc.weight"), a name in
// /model ("fc.weight"), or any unique path suffix. Throws InvalidArgument listing
// candidates otherwise.
std::string resolve_tensor(const checkpoint::FileReader& file, const std::string& name);

using Command = int (*)(const Args&, std::ostream& out);
int cmd_ls(const Args&, std::ostream&);
int cmd_show(const Args&, std::ostream&);
int cmd_meta(const Args&, std::ostream&);
int cmd_verify(const Args&, std::ostream&);
int cmd_diff(const Args&, std::ostream&);
int cmd_export(const Args&, std::ostream&);

}  // namespace troupe::ckpt_tool
