// A UTF-8 text file as a character-level corpus, as nanoGPT's shakespeare_char
// preparation makes one: the vocabulary is the sorted set of the distinct code points
// of the whole file, a character's id is its position in it, and the text becomes one
// stream of ids. Loading checks the bytes and names the file and byte offset of
// anything that is not UTF-8, of a corrupt gzip stream, or an empty file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/tensor/tensor.hpp"

namespace troupe::examples {

struct CharCorpus {
  std::vector<char32_t> vocab;  // sorted distinct code points; id = position
  Tensor tokens;                // i64 [characters]: every character's id

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(vocab.size()); }
  // The vocabulary as one UTF-8 string (what checkpoints record as `vocab`).
  std::string vocab_utf8() const;
  // The text of `ids`; an id outside the vocabulary is an InvalidArgument.
  std::string decode(const std::vector<std::int64_t>& ids) const;
};

// The bytes of a file, gzip-compressed or plain. Throws InvalidArgument for a missing
// file and FormatError naming the file for corrupt compressed data.
std::string read_text_file(const std::string& path);

// Reads a UTF-8 file, gzip-compressed or plain. Throws InvalidArgument for a missing
// file and FormatError naming the file for corrupt data, bad UTF-8 or no text.
CharCorpus load_char_corpus(const std::string& path);

// The code points of a UTF-8 string; `what` names it in a FormatError.
std::vector<char32_t> decode_utf8(std::string_view bytes, const std::string& what);
std::string encode_utf8(const std::vector<char32_t>& code_points);

}  // namespace troupe::examples
