// cereal's binary archives over plain buffers: a message is serialized once,
// straight behind its header, and parsed in place, every length bounded by the
// bytes that arrived.
#pragma once

#include <cereal/archives/binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/unordered_map.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <streambuf>
#include <string>
#include <string_view>
#include <type_traits>

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

// cereal's binary format, read straight from a message's bytes, with every length
// checked before anything is allocated: a container, string or tensor announcing
// more elements than bytes remain is refused (each element takes at least one byte
// on the wire), so a forged length prefix costs an exception, not gigabytes.
class SpanInputArchive : public cereal::InputArchive<SpanInputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit SpanInputArchive(std::string_view bytes)
      : InputArchive(this), at_(bytes.data()), end_(bytes.data() + bytes.size()) {}

  void loadBinary(void* data, std::size_t size) {
    if (size > remaining()) throw cereal::Exception(concat("wants ", size, " more bytes, ", remaining(), " remain"));
    if (size > 0) std::memcpy(data, at_, size);
    at_ += size;
  }
  void check_length(std::uint64_t elements) const {
    if (elements > remaining())
      throw cereal::Exception(concat("a length of ", elements, " with ", remaining(), " bytes remaining"));
  }
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - at_); }

 private:
  const char* at_;
  const char* end_;
};

template <class T>
std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>> CEREAL_LOAD_FUNCTION_NAME(
    SpanInputArchive& archive, T& value) {
  archive.loadBinary(std::addressof(value), sizeof value);
}
// A byte other than 0 or 1 is not a bool (reading it as one is undefined behaviour).
inline void CEREAL_LOAD_FUNCTION_NAME(SpanInputArchive& archive, bool& value) {
  std::uint8_t byte = 0;
  archive.loadBinary(&byte, 1);
  if (byte > 1) throw cereal::Exception(concat("a bool of value ", int{byte}));
  value = byte == 1;
}
template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(SpanInputArchive& archive, cereal::NameValuePair<T>& pair) {
  archive(pair.value);
}
template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(SpanInputArchive& archive, cereal::SizeTag<T>& tag) {
  archive(tag.size);
  archive.check_length(static_cast<std::uint64_t>(tag.size));
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(SpanInputArchive& archive, cereal::BinaryData<T>& data) {
  archive.loadBinary(data.data, static_cast<std::size_t>(data.size));
}

// A message whose bytes do not parse as what they should be.
class BadMessage : public Error {
 public:
  using Error::Error;
};

// A stream object for this thread, pointed at a new buffer for each message:
// constructing a std::ostream (its locale) costs about 80 ns, twice per round trip
// (reading needs no stream: SpanInputArchive). A nested use on the same thread (a
// type whose serialization serializes another message) gets a fresh one.
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

// ObjectRefs parsed on this thread while it is set carry no weight, because their
// bytes may be parsed more than once: a stored value at each fetch, an actor's
// constructor arguments at each restart. The weight those bytes took along is never
// returned, so the objects they name stay pinned.
bool& uncounted_refs();
class UncountedRefsScope {
 public:
  UncountedRefsScope() : previous_(uncounted_refs()) { uncounted_refs() = true; }
  ~UncountedRefsScope() { uncounted_refs() = previous_; }
  UncountedRefsScope(const UncountedRefsScope&) = delete;
  UncountedRefsScope& operator=(const UncountedRefsScope&) = delete;

 private:
  bool previous_;
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
  SpanInputArchive archive(bytes);
  try {
    if constexpr (sizeof...(T) > 0) archive(values...);
  } catch (const std::exception& e) {
    throw BadMessage(concat(what, ": ", bytes.size(), " bytes do not deserialize (", e.what(), ")"));
  }
  if (archive.remaining() != 0)
    throw BadMessage(concat(what, ": ", archive.remaining(), " unexpected bytes after the arguments"));
}

}  // namespace troupe::actors::detail

// Types with load_minimal find the output archive that matches this input archive.
namespace cereal::traits::detail {
template <>
struct get_output_from_input<troupe::actors::detail::SpanInputArchive> {
  using type = cereal::BinaryOutputArchive;
};
}  // namespace cereal::traits::detail
CEREAL_REGISTER_ARCHIVE(troupe::actors::detail::SpanInputArchive)
