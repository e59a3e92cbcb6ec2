#include "troupe/supervisor/protocol.hpp"

#include <cstring>

#include "troupe/error.hpp"

namespace troupe::supervisor {
namespace {

// Little-endian writer/reader: the wire format must not depend on the host.
class Writer {
 public:
  void u8(std::uint8_t v) { bytes_.push_back(v); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void str(std::string_view s) {
    TROUPE_CHECK(s.size() <= 0xffff, "supervisor protocol: string of ", s.size(), " bytes is too long");
    u16(static_cast<std::uint16_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  std::vector<std::uint8_t> frame() && {
    TROUPE_CHECK(bytes_.size() - kFrameHeader <= kMaxPayload, "supervisor protocol: message of ",
                 bytes_.size() - kFrameHeader, " bytes exceeds the limit of ", kMaxPayload);
    auto n = static_cast<std::uint32_t>(bytes_.size() - kFrameHeader);
    for (int i = 0; i < 4; ++i) bytes_[i] = static_cast<std::uint8_t>(n >> (8 * i));
    return std::move(bytes_);
  }

 private:
  void put(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  std::vector<std::uint8_t> bytes_ = std::vector<std::uint8_t>(kFrameHeader, 0);
};

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8(const char* what) { return static_cast<std::uint8_t>(get(1, what)); }
  std::uint16_t u16(const char* what) { return static_cast<std::uint16_t>(get(2, what)); }
  std::uint32_t u32(const char* what) { return static_cast<std::uint32_t>(get(4, what)); }
  std::uint64_t u64(const char* what) { return get(8, what); }
  std::string str(const char* what) {
    std::size_t n = u16(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + at_), n);
    at_ += n;
    return s;
  }
  void finish(const char* kind) const {
    if (at_ != size_)
      TROUPE_THROW(FormatError, "supervisor protocol: ", size_ - at_, " unexpected bytes after a ", kind,
                   " message of ", size_, " bytes");
  }

 private:
  void need(std::size_t n, const char* what) const {
    if (size_ - at_ < n)
      TROUPE_THROW(FormatError, "supervisor protocol: message of ", size_, " bytes ends inside field '", what,
                   "' (needs ", n, " bytes at offset ", at_, ")");
  }
  std::uint64_t get(int n, const char* what) {
    need(static_cast<std::size_t>(n), what);
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t{data_[at_ + i]} << (8 * i);
    at_ += static_cast<std::size_t>(n);
    return v;
  }
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<std::uint8_t> encode(const Message& message) {
  Writer w;
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, Hello>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::hello));
          w.u16(kProtocolVersion);
          w.str(m.token);
          w.str(m.run_id);
          w.u32(m.restart);
          w.u32(m.rank);
          w.u32(m.world_size);
          w.u32(m.pid);
          w.str(m.host);
        } else if constexpr (std::is_same_v<M, Welcome>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::welcome));
        } else if constexpr (std::is_same_v<M, Refused>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::refused));
          w.str(m.reason.substr(0, 512));
        } else if constexpr (std::is_same_v<M, Heartbeat>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::heartbeat));
          w.u64(m.step);
          w.u64(m.sequence);
          w.u8(static_cast<std::uint8_t>((m.has_step ? 1 : 0) | (m.has_sequence ? 2 : 0)));
          w.u8(static_cast<std::uint8_t>(m.phase));
          w.u64(m.work_us);
          w.u64(m.work_steps);
        } else if constexpr (std::is_same_v<M, Goodbye>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::goodbye));
        } else if constexpr (std::is_same_v<M, Alive>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::alive));
        } else if constexpr (std::is_same_v<M, Notice>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::notice));
          w.u8(static_cast<std::uint8_t>(m.kind));
          w.str(std::string_view(m.text).substr(0, kMaxNoticeText));
        } else if constexpr (std::is_same_v<M, Dump>) {
          w.u8(static_cast<std::uint8_t>(MessageKind::dump));
        } else {
          w.u8(static_cast<std::uint8_t>(MessageKind::stop));
        }
      },
      message);
  return std::move(w).frame();
}

std::uint32_t decode_length(const std::uint8_t header[kFrameHeader]) {
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= std::uint32_t{header[i]} << (8 * i);
  if (n == 0) TROUPE_THROW(FormatError, "supervisor protocol: empty frame (length prefix 0)");
  if (n > kMaxPayload)
    TROUPE_THROW(FormatError, "supervisor protocol: length prefix ", n, " exceeds the limit of ", kMaxPayload,
                 " bytes");
  return n;
}

Message decode_payload(const std::uint8_t* data, std::size_t size) {
  Reader r(data, size);
  auto kind = r.u8("kind");
  switch (static_cast<MessageKind>(kind)) {
    case MessageKind::hello: {
      auto version = r.u16("version");
      if (version != kProtocolVersion)
        TROUPE_THROW(FormatError, "supervisor protocol: hello with version ", version,
                     ", this troupe-run speaks version ", kProtocolVersion);
      Hello h;
      h.token = r.str("token");
      h.run_id = r.str("run_id");
      h.restart = r.u32("restart");
      h.rank = r.u32("rank");
      h.world_size = r.u32("world_size");
      h.pid = r.u32("pid");
      h.host = r.str("host");
      r.finish("hello");
      return h;
    }
    case MessageKind::welcome: r.finish("welcome"); return Welcome{};
    case MessageKind::refused: {
      Refused m{r.str("reason")};
      r.finish("refused");
      return m;
    }
    case MessageKind::heartbeat: {
      Heartbeat b;
      b.step = r.u64("step");
      b.sequence = r.u64("sequence");
      auto flags = r.u8("flags");
      if (flags > 3) TROUPE_THROW(FormatError, "supervisor protocol: heartbeat flags ", int{flags}, " not in 0..3");
      b.has_step = flags & 1;
      b.has_sequence = flags & 2;
      auto phase = r.u8("phase");
      if (phase >= kPhases)
        TROUPE_THROW(FormatError, "supervisor protocol: heartbeat phase ", int{phase}, " not in 0..", kPhases - 1);
      b.phase = static_cast<Phase>(phase);
      b.work_us = r.u64("work_us");
      b.work_steps = r.u64("work_steps");
      r.finish("heartbeat");
      return b;
    }
    case MessageKind::goodbye: r.finish("goodbye"); return Goodbye{};
    case MessageKind::alive: r.finish("alive"); return Alive{};
    case MessageKind::stop: r.finish("stop"); return Stop{};
    case MessageKind::dump: r.finish("dump"); return Dump{};
    case MessageKind::notice: {
      Notice n;
      const auto kind = r.u8("notice kind");
      if (kind < 1 || kind > kNoticeKinds)
        TROUPE_THROW(FormatError, "supervisor protocol: notice kind ", int{kind}, " not in 1..", kNoticeKinds);
      n.kind = static_cast<NoticeKind>(kind);
      n.text = r.str("text");
      if (n.text.size() > kMaxNoticeText)
        TROUPE_THROW(FormatError, "supervisor protocol: notice text of ", n.text.size(), " bytes exceeds ",
                     kMaxNoticeText);
      r.finish("notice");
      return n;
    }
  }
  TROUPE_THROW(FormatError, "supervisor protocol: unknown message kind ", int{kind});
}

namespace {
constexpr std::string_view kPhaseNames[kPhases] = {"startup",         "training",        "evaluation",
                                                   "checkpoint_save", "checkpoint_load", "data_loading"};
}  // namespace

std::string_view phase_name(Phase phase) {
  auto i = static_cast<int>(phase);
  return i >= 0 && i < kPhases ? kPhaseNames[i] : std::string_view("unknown");
}

Phase parse_phase(std::string_view name) {
  std::string choices;
  for (int i = 0; i < kPhases; ++i) {
    if (kPhaseNames[i] == name) return static_cast<Phase>(i);
    choices += (i ? ", " : "") + std::string(kPhaseNames[i]);
  }
  TROUPE_THROW(InvalidArgument, "unknown phase '", name, "' (phases: ", choices, ")");
}

std::string_view kind_name(const Message& message) {
  static constexpr std::string_view names[] = {"hello", "welcome", "refused", "heartbeat", "goodbye",
                                               "alive", "stop",    "notice",  "dump"};
  return names[message.index()];
}

std::string_view notice_name(NoticeKind kind) {
  switch (kind) {
    case NoticeKind::save_failed: return "save_failed";
    case NoticeKind::started_fresh: return "started_fresh";
    case NoticeKind::error: return "rank_error";
  }
  return "unknown";
}

}  // namespace troupe::supervisor
