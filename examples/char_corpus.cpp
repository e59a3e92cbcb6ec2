#include "char_corpus.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "troupe/error.hpp"

namespace troupe::examples {

std::string read_text_file(const std::string& path) {
  if (!std::filesystem::exists(path)) TROUPE_THROW(InvalidArgument, "text file '", path, "' does not exist");
  // gzopen reads plain files too, so either form works.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) TROUPE_THROW(InvalidArgument, "cannot open text file '", path, "': ", std::strerror(errno));
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const int n = gzread(file.get(), buffer, sizeof buffer);
    if (n < 0) {
      int zerr = Z_OK;
      const char* message = gzerror(file.get(), &zerr);
      TROUPE_THROW(FormatError, path, ": compressed data is corrupt (", message, ") after ", bytes.size(), " bytes");
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<std::size_t>(n));
  }
  int zerr = Z_OK;
  const char* message = gzerror(file.get(), &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END)
    TROUPE_THROW(FormatError, path, ": compressed data is corrupt or truncated (", message, ") after ", bytes.size(),
                 " bytes");
  return bytes;
}

std::vector<char32_t> decode_utf8(std::string_view bytes, const std::string& what) {
  std::vector<char32_t> out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    int extra = 0;
    char32_t c = 0;
    if (lead < 0x80)
      c = lead;
    else if ((lead & 0xE0) == 0xC0)
      extra = 1, c = lead & 0x1F;
    else if ((lead & 0xF0) == 0xE0)
      extra = 2, c = lead & 0x0F;
    else if ((lead & 0xF8) == 0xF0)
      extra = 3, c = lead & 0x07;
    else
      TROUPE_THROW(FormatError, what, ": byte ", i, " (value ", int{lead}, ") does not start a UTF-8 character");
    if (i + static_cast<std::size_t>(extra) >= bytes.size())
      TROUPE_THROW(FormatError, what, ": the UTF-8 character at byte ", i, " is cut off by the end of the text");
    for (int k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(bytes[i + static_cast<std::size_t>(k)]);
      if ((next & 0xC0) != 0x80)
        TROUPE_THROW(FormatError, what, ": byte ", i + static_cast<std::size_t>(k),
                     " is not a UTF-8 continuation byte");
      c = (c << 6) | (next & 0x3F);
    }
    static constexpr char32_t kSmallest[] = {0, 0x80, 0x800, 0x10000};
    if (c < kSmallest[extra] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
      TROUPE_THROW(FormatError, what, ": the UTF-8 sequence at byte ", i, " is not a valid character");
    out.push_back(c);
    i += static_cast<std::size_t>(extra) + 1;
  }
  return out;
}

std::string encode_utf8(const std::vector<char32_t>& code_points) {
  std::string out;
  for (const char32_t c : code_points) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

std::string CharCorpus::vocab_utf8() const { return encode_utf8(vocab); }

std::string CharCorpus::decode(const std::vector<std::int64_t>& ids) const {
  std::vector<char32_t> text;
  text.reserve(ids.size());
  for (const std::int64_t id : ids) {
    TROUPE_CHECK(id >= 0 && id < vocab_size(), "CharCorpus::decode: id ", id, " is outside the vocabulary of ",
                 vocab_size());
    text.push_back(vocab[static_cast<std::size_t>(id)]);
  }
  return encode_utf8(text);
}

CharCorpus load_char_corpus(const std::string& path) {
  const std::vector<char32_t> text = decode_utf8(read_text_file(path), path);
  if (text.empty()) TROUPE_THROW(FormatError, path, ": the file holds no text");
  CharCorpus corpus;
  corpus.vocab = text;
  std::sort(corpus.vocab.begin(), corpus.vocab.end());
  corpus.vocab.erase(std::unique(corpus.vocab.begin(), corpus.vocab.end()), corpus.vocab.end());
  corpus.tokens = Tensor::empty({static_cast<std::int64_t>(text.size())}, tensor::DType::i64);
  auto* ids = corpus.tokens.data<std::int64_t>();
  for (std::size_t i = 0; i < text.size(); ++i)
    ids[i] = std::lower_bound(corpus.vocab.begin(), corpus.vocab.end(), text[i]) - corpus.vocab.begin();
  return corpus;
}

}  // namespace troupe::examples
