// The wire format of actor messages: a fixed header, then the cereal payload, in one
// MPI message on the actors' communicator. The header is checked field by field on
// arrival, so bytes from a buggy or hostile sender are reported, not trusted.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace troupe::actors::detail {

inline constexpr int kActorTag = 7;
inline constexpr std::uint32_t kMagic = 0x50555254;  // "TRUP"
inline constexpr std::uint8_t kVersion = 2;          // 2: the header grew a deadline

enum class Kind : std::uint8_t {
  request = 1,          // ask: the sender waits for a reply with the same request id
  tell = 2,             // no reply
  reply_value = 3,      // payload: the serialized result
  reply_error = 4,      // payload: ErrorInfo
  spawn = 5,            // payload: factory key, name, constructor arguments
  lookup = 6,           // to rank 0; payload: name
  register_name = 7,    // to rank 0; payload: name, rank, id, type
  heartbeat = 8,        // no payload: "this rank is alive", on the liveness communicator only
  cancel = 9,           // no payload, no reply: cancel the sender's ask `request` to `actor`
  kill = 10,            // stop `actor` for good; the reply is empty
  list_actors = 11,     // no payload; the reply: this rank's actors (Runtime::actors)
  request_ref = 12,     // as request, but the result stays here; the reply: its ObjectRef
  fetch_object = 13,    // `actor` holds the object id; the reply: the stored value
  free_object = 14,     // `actor` holds the object id; no reply
  release_object = 15,  // `actor`: the object id, `request`: the weight given back; no reply
};
inline constexpr Kind kLastKind = Kind::release_object;

// With attachments (see bytes.hpp) the header is followed by one u64 size per
// attachment, then the payload. Each attachment follows as its own MPI message from
// the same sender with tag `attachment_tag` -- or, when `attachment_tag` is
// kAttachedTag, within this message: the size table then holds one more u64, where
// the payload ends, and each attachment starts at the next multiple of
// kAttachedAlignment from there (messages up to kAttachedLimit in all; see
// Transport::send).
struct Header {
  std::uint32_t magic = kMagic;
  std::uint8_t version = kVersion;
  Kind kind = Kind::request;
  std::uint16_t attachments = 0;
  std::uint32_t method = 0;
  std::uint32_t attachment_tag = 0;
  std::uint64_t request = 0;
  std::uint64_t actor = 0;
  // A request's deadline as the time left when it was sent, in nanoseconds (0: none).
  // Relative, as gRPC's timeout: the ranks' steady clocks do not agree; the receiver
  // counts from arrival, so transit time is the only slack.
  std::uint64_t budget_ns = 0;
};
static_assert(sizeof(Header) == 40);

inline void write_header(std::string& message, const Header& h) { std::memcpy(message.data(), &h, sizeof h); }

// Attachment tags cycle through this range; a sender would need this many messages
// with attachments in flight to one receiver before a tag could be reused early.
inline constexpr int kFirstAttachmentTag = 1000;
inline constexpr int kAttachmentTags = 30000;
inline constexpr std::uint32_t kAttachedTag = 0;
inline constexpr std::size_t kAttachedAlignment = 64;
inline constexpr std::size_t kAttachedLimit = 256 * 1024;

// Where an attachment within a message starts: the next multiple of kAttachedAlignment.
inline std::size_t align_attached(std::size_t offset) {
  return (offset + kAttachedAlignment - 1) / kAttachedAlignment * kAttachedAlignment;
}

// Parses the header of `bytes`; returns an explanation when it is not one of ours.
inline std::string read_header(std::string_view bytes, Header& h) {
  if (bytes.size() < sizeof(Header))
    return "message of " + std::to_string(bytes.size()) + " bytes is shorter than a header";
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kMagic) return "bad magic number";
  if (h.version != kVersion)
    return "wire version " + std::to_string(h.version) + ", expected " + std::to_string(kVersion);
  if (h.kind < Kind::request || h.kind > kLastKind)
    return "unknown message kind " + std::to_string(static_cast<int>(h.kind));
  return {};
}

}  // namespace troupe::actors::detail
