// Bytes: a large byte buffer that travels beside an actor message instead of
// inside it.
//
// When a Bytes of more than kInlineBytes is an argument or a result of an ask/tell
// to another rank, the message's archive carries only its index; the bytes are sent
// straight from this buffer (no serialization copy) -- in the same MPI message up
// to 256 KB in all, as MPI messages of their own above -- and received into a
// pooled, uninitialised buffer on the other side (no zero-fill). A Bytes shares its
// buffer: copying one copies a pointer (a received one may share its pooled buffer
// with the rest of its message). Outside actor messages (any other cereal binary
// archive) it is written inline, length-prefixed.
#pragma once

#include <cereal/cereal.hpp>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "troupe/actors/detail/serialization.hpp"
#include "troupe/error.hpp"

namespace troupe::actors {

class Bytes {
 public:
  Bytes() = default;
  // Takes ownership of `data`.
  explicit Bytes(std::vector<std::byte> data) {
    auto owned = std::make_shared<std::vector<std::byte>>(std::move(data));
    data_ = owned->data();
    size_ = owned->size();
    owner_ = std::move(owned);
  }
  // A view of memory kept alive by `owner` (a pooled buffer, a tensor's storage).
  Bytes(std::shared_ptr<const void> owner, const std::byte* data, std::size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  static Bytes copy_of(const void* data, std::size_t size) {
    const auto* p = static_cast<const std::byte*>(data);
    return Bytes(std::vector<std::byte>(p, p + size));
  }

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<const std::byte> span() const { return {data_, size_}; }
  // A view of `size` bytes from `offset`, sharing this buffer.
  Bytes slice(std::size_t offset, std::size_t size) const {
    TROUPE_CHECK(offset <= size_ && size <= size_ - offset, "Bytes::slice: [", offset, ", +", size, ") is outside ",
                 size_, " bytes");
    return Bytes(owner_, data_ + offset, size);
  }
  // Content equality.
  friend bool operator==(const Bytes& a, const Bytes& b) {
    return a.size_ == b.size_ && (a.size_ == 0 || std::memcmp(a.data_, b.data_, a.size_) == 0);
  }

 private:
  std::shared_ptr<const void> owner_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Up to this size a Bytes in an actor message is written inline all the same: a
// second MPI message costs more than copying a few KB (over TCP, an 8 B ask took
// 2.3x as long as an attachment), and it stays within every transport's eager limit.
inline constexpr std::size_t kInlineBytes = 4096;

namespace detail {

// The attachments of the message being written or read on this thread, set by the
// runtime around serialization and parsing; null elsewhere.
std::vector<Bytes>*& outgoing_attachments();
const std::vector<Bytes>*& incoming_attachments();

template <class Pointer>
class AttachmentScope {
 public:
  AttachmentScope(Pointer& slot, std::type_identity_t<Pointer> value) : slot_(slot), previous_(slot) { slot_ = value; }
  ~AttachmentScope() { slot_ = previous_; }
  AttachmentScope(const AttachmentScope&) = delete;
  AttachmentScope& operator=(const AttachmentScope&) = delete;

 private:
  Pointer& slot_;
  Pointer previous_;
};

}  // namespace detail

template <class Archive>
void save(Archive& archive, const Bytes& bytes) {
  if (auto* out = detail::outgoing_attachments(); out && bytes.size() > kInlineBytes) {
    archive(true, static_cast<std::uint64_t>(out->size()));
    out->push_back(bytes);
    return;
  }
  archive(false, cereal::make_size_tag(static_cast<cereal::size_type>(bytes.size())));
  archive(cereal::binary_data(const_cast<std::byte*>(bytes.data()), bytes.size()));
}

template <class Archive>
void load(Archive& archive, Bytes& bytes) {
  bool attached = false;
  archive(attached);
  if (attached) {
    std::uint64_t index = 0;
    archive(index);
    const auto* in = detail::incoming_attachments();
    if (in == nullptr || index >= in->size())
      throw detail::BadMessage(
          detail::concat("attachment #", index, " is not among the message's ", in ? in->size() : 0, " attachments"));
    bytes = (*in)[index];
    return;
  }
  cereal::size_type size = 0;
  archive(cereal::make_size_tag(size));
  std::vector<std::byte> data(size);
  archive(cereal::binary_data(data.data(), size));
  bytes = Bytes(std::move(data));
}

}  // namespace troupe::actors

namespace troupe {
using actors::Bytes;
}
