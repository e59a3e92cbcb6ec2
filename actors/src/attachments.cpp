// The receiving side of attachments (wire.hpp): pooled receive buffers, messages that
// carry their attachments within them, and messages held while their attachments
// arrive as MPI messages of their own.
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "transport.hpp"
#include "troupe/keep_until_exit.hpp"
#include "troupe/mpi/mpi_error.hpp"
#include "wire.hpp"

namespace troupe::actors::detail {

Bytes BufferPool::acquire(std::size_t size) {
  // Class c holds buffers of 2^c bytes; small ones are not worth pooling.
  constexpr std::size_t kMinClass = 16, kMaxKept = 4;
  std::size_t cls = kMinClass;
  while ((std::size_t{1} << cls) < size) ++cls;
  std::unique_ptr<std::byte[]> buffer;
  {
    std::lock_guard lock(mutex_);
    if (free_.size() <= cls) free_.resize(cls + 1);
    if (!free_[cls].empty()) {
      buffer = std::move(free_[cls].back());
      free_[cls].pop_back();
    }
  }
  if (!buffer) buffer.reset(new std::byte[std::size_t{1} << cls]);  // uninitialised on purpose
  std::byte* data = buffer.get();
  std::shared_ptr<const void> owner(buffer.release(), [pool = shared_from_this(), cls](const void* p) {
    std::unique_ptr<std::byte[]> back(static_cast<std::byte*>(const_cast<void*>(p)));
    std::lock_guard lock(pool->mutex_);
    if (pool->free_[cls].size() < kMaxKept) pool->free_[cls].push_back(std::move(back));
  });
  return Bytes(std::move(owner), data, size);
}

namespace {
bool dropped(const Message& message, const std::string& why) {
  std::fprintf(stderr, "troupe: dropped a message with attachments from rank %d: %s\n", message.source, why.c_str());
  return false;
}
}  // namespace

bool split_attached(Message& message, const Bytes& whole) {
  Header h;
  std::memcpy(&h, whole.data(), sizeof h);
  const std::size_t table = (h.attachments + std::size_t{1}) * sizeof(std::uint64_t);
  if (whole.size() < sizeof h + table) return dropped(message, "its size table is cut short");
  std::uint64_t end = 0;
  std::memcpy(&end, whole.data() + sizeof h + h.attachments * sizeof end, sizeof end);
  if (end < sizeof h + table || end > whole.size())
    return dropped(message,
                   "its payload claims to end at byte " + std::to_string(end) + " of " + std::to_string(whole.size()));
  std::size_t offset = static_cast<std::size_t>(end);
  for (std::size_t i = 0; i < h.attachments; ++i) {
    std::uint64_t size = 0;
    std::memcpy(&size, whole.data() + sizeof h + i * sizeof size, sizeof size);
    offset = align_attached(offset);
    if (offset > whole.size() || size > whole.size() - offset)
      return dropped(message, "attachment " + std::to_string(i) + " of " + std::to_string(size) + " bytes at byte " +
                                  std::to_string(offset) + " runs past the message's " + std::to_string(whole.size()));
    message.attachments.push_back(whole.slice(offset, static_cast<std::size_t>(size)));
    offset += static_cast<std::size_t>(size);
  }
  if (offset != whole.size())
    return dropped(message, std::to_string(whole.size() - offset) + " bytes follow its last attachment");
  const auto* bytes = reinterpret_cast<const char*>(whole.data());
  message.bytes.reserve(static_cast<std::size_t>(end) - table);
  message.bytes.assign(bytes, sizeof h);
  message.bytes.append(bytes + sizeof h + table, static_cast<std::size_t>(end) - sizeof h - table);
  return true;
}

bool Transport::hold(Message message) {
  Header h;
  std::memcpy(&h, message.bytes.data(), sizeof h);
  const std::size_t table = h.attachments * sizeof(std::uint64_t);
  auto drop = [&](const std::string& why) { return dropped(message, why); };
  if (message.bytes.size() < sizeof h + table) return drop("its size table is cut short");
  if (h.attachment_tag < static_cast<std::uint32_t>(kFirstAttachmentTag) ||
      h.attachment_tag >= static_cast<std::uint32_t>(kFirstAttachmentTag + kAttachmentTags))
    return drop("attachment tag " + std::to_string(h.attachment_tag) + " is out of range");
  Held held;
  held.tag = static_cast<int>(h.attachment_tag);
  held.sizes.resize(h.attachments);
  std::memcpy(held.sizes.data(), message.bytes.data() + sizeof h, table);
  for (std::size_t i = 0; i < held.sizes.size(); ++i)
    if (held.sizes[i] > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
      return drop("attachment " + std::to_string(i) + " claims " + std::to_string(held.sizes[i]) + " bytes");
  message.bytes.erase(sizeof h, table);
  held.message = std::move(message);
  held.deadline = Clock::now() + attachment_timeout_;
  held_[held.message.source].push_back(std::move(held));
  return true;
}

// The sender sends each attachment right after its message, so the next one's
// envelope is due at once; one that has not begun to arrive within the timeout
// never will. Its size is checked against the table before anything is allocated,
// then a receive is posted with that size, which lets Open MPI's shared-memory
// transport copy once, straight from the sender's buffer (a probe and matched
// receive took a 16 MB round trip to 2.8x raw MPI).
Transport::HeldState Transport::advance(Held& held) {
  const int source = held.message.source;
  while (held.next < held.sizes.size()) {
    const std::uint64_t size = held.sizes[held.next];
    const auto which = [&] { return "attachment " + std::to_string(held.next); };
    if (held.request == MPI_REQUEST_NULL) {
      int arrived = 0;
      MPI_Status status;
      TROUPE_MPI_CHECK(MPI_Iprobe(source, held.tag, comm_, &arrived, &status));
      if (!arrived) {
        if (Clock::now() < held.deadline) return HeldState::waiting;
        dropped(held.message,
                which() + " did not arrive within " + std::to_string(attachment_timeout_.count()) + " ms");
        return HeldState::dropped;
      }
      int count = 0;
      TROUPE_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
      if (static_cast<std::uint64_t>(count) != size) {
        // Its bytes were sent: take them off MPI's queue, then drop the message.
        MPI_Message handle;
        TROUPE_MPI_CHECK(MPI_Improbe(source, held.tag, comm_, &arrived, &handle, &status));
        if (arrived) {
          std::vector<std::byte> discard(static_cast<std::size_t>(count));
          TROUPE_MPI_CHECK(MPI_Mrecv(discard.data(), count, MPI_BYTE, &handle, &status));
        }
        dropped(held.message,
                which() + " has " + std::to_string(count) + " bytes, the table says " + std::to_string(size));
        return HeldState::dropped;
      }
      held.buffer = pool_->acquire(static_cast<std::size_t>(size));
      TROUPE_MPI_CHECK(MPI_Irecv(const_cast<std::byte*>(held.buffer.data()), static_cast<int>(size), MPI_BYTE, source,
                                 held.tag, comm_, &held.request));
    }
    int done = 0;
    TROUPE_MPI_CHECK(MPI_Test(&held.request, &done, MPI_STATUS_IGNORE));
    if (!done) return HeldState::waiting;
    held.message.attachments.push_back(std::move(held.buffer));
    ++held.next;
    held.deadline = Clock::now() + attachment_timeout_;
  }
  return HeldState::ready;
}

bool Transport::advance_held() {
  for (auto it = held_.begin(); it != held_.end();) {
    auto& queue = it->second;
    while (!queue.empty()) {
      const HeldState state = advance(queue.front());
      if (state == HeldState::waiting) break;
      Message message = std::move(queue.front().message);
      queue.pop_front();
      if (state == HeldState::ready) deliver_(std::move(message));
    }
    it = queue.empty() ? held_.erase(it) : std::next(it);
  }
  return !held_.empty();
}

// At shutdown: a receive still posted is cancelled; one MPI cannot cancel within a
// second keeps its buffer for the process's life rather than freeing it under MPI.
void Transport::cancel_held() {
  for (auto& [source, queue] : held_)
    for (Held& held : queue) {
      if (held.request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&held.request);
      const auto give_up = Clock::now() + std::chrono::seconds(1);
      int done = 0;
      while (!done && Clock::now() < give_up) MPI_Test(&held.request, &done, MPI_STATUS_IGNORE);
      if (!done) troupe::detail::keep_until_exit(new Bytes(std::move(held.buffer)));
    }
  held_.clear();
}

}  // namespace troupe::actors::detail
