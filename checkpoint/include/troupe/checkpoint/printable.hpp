// Names and strings read from a checkpoint file are the file's to choose: a crafted one
// can hold a newline (forging a second line of a tool's output), terminal escape
// sequences or bytes that are not text. Every message that quotes one passes it through
// printable() first.
#pragma once

#include <string>
#include <string_view>

namespace troupe::checkpoint {

// `bytes` with every byte outside printable ASCII written as \xNN, and a backslash as \\,
// so that the result is one line and says exactly which bytes the file holds.
inline std::string printable(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (b == '\\') {
      out += "\\\\";
    } else if (b >= 0x20 && b < 0x7f) {
      out += c;
    } else {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0xf];
    }
  }
  return out;
}

}  // namespace troupe::checkpoint
