// Byte streams for cereal's binary archives that write into and read from plain
// buffers, so a message is serialized once, straight behind its header, and parsed
// in place without copying into a std::stringstream.
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/unordered_map.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <optional>
#include <streambuf>
#include <string>
#include <string_view>

#include "troupe/error.hpp"

namespace troupe::actors::detail {

using ::troupe::detail::concat;

// Appends everything written to a std::string.
class StringSink : public std::streambuf {
 public:
  explicit StringSink(std::string& out) : out_(out) {}

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    out_.append(s, static_cast<std::size_t>(n));
    return n;
  }
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) out_.push_back(static_cast<char>(c));
    return c;
  }

 private:
  std::string& out_;
};

// Reads from a fixed span of bytes; a read past the end comes back short, which
// cereal reports as an exception (a truncated message), never as a crash.
class SpanSource : public std::streambuf {
 public:
  explicit SpanSource(std::string_view bytes) {
    char* begin = const_cast<char*>(bytes.data());  // get area is read-only in practice
    setg(begin, begin, begin + bytes.size());
  }
  std::size_t remaining() const { return static_cast<std::size_t>(egptr() - gptr()); }
};

// A message whose bytes do not parse as what they should be.
class BadMessage : public Error {
 public:
  using Error::Error;
};

// A stream object for this thread, pointed at a new buffer for each message:
// constructing a std::ostream/istream (its locale) costs about 80 ns, four times per
// round trip. A nested use on the same thread (a type whose serialization serializes
// another message) gets a fresh one.
template <class Stream>
class ReusedStream {
 public:
  explicit ReusedStream(std::streambuf* buffer) {
    if (in_use()) {
      own_.emplace(buffer);
      stream_ = &*own_;
      return;
    }
    in_use() = true;
    stream_ = &shared();
    stream_->rdbuf(buffer);
    stream_->clear();
  }
  ~ReusedStream() {
    if (own_) return;
    stream_->rdbuf(nullptr);
    in_use() = false;
  }
  ReusedStream(const ReusedStream&) = delete;
  ReusedStream& operator=(const ReusedStream&) = delete;
  Stream& get() { return *stream_; }

 private:
  static Stream& shared() {
    thread_local Stream stream(nullptr);
    return stream;
  }
  static bool& in_use() {
    thread_local bool used = false;
    return used;
  }
  Stream* stream_;
  std::optional<Stream> own_;
};

// Appends the binary serialization of `values` to `out`.
template <class... T>
void append_serialized(std::string& out, const T&... values) {
  StringSink sink(out);
  ReusedStream<std::ostream> stream(&sink);
  cereal::BinaryOutputArchive archive(stream.get());
  if constexpr (sizeof...(T) > 0) archive(values...);
}

// Parses `values` from all of `bytes`; BadMessage if they are short or too long.
template <class... T>
void parse_exactly(std::string_view bytes, const char* what, T&... values) {
  SpanSource source(bytes);
  ReusedStream<std::istream> reused(&source);
  std::istream& stream = reused.get();
  try {
    cereal::BinaryInputArchive archive(stream);
    if constexpr (sizeof...(T) > 0) archive(values...);
  } catch (const std::exception& e) {
    throw BadMessage(concat(what, ": ", bytes.size(), " bytes do not deserialize (", e.what(), ")"));
  }
  if (source.remaining() != 0)
    throw BadMessage(concat(what, ": ", source.remaining(), " unexpected bytes after the arguments"));
}

}  // namespace troupe::actors::detail
