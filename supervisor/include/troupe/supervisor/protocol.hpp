// The heartbeat protocol between a rank (SupervisorClient) and troupe-run.
//
// One TCP connection per rank. Every message is a frame: a 4-byte little-endian
// payload length, then the payload, whose first byte is the message kind. The rank
// speaks first (Hello, carrying the run's token); troupe-run answers Welcome or
// Refused (with a reason) and closes on refusal. Then the rank sends Heartbeats with
// its progress and, on a clean exit, Goodbye. A connection that closes without
// Goodbye is a dead rank. troupe-run answers each Heartbeat with Alive, so a rank
// knows in turn whether troupe-run still hears it (SupervisorClient's fencing), and
// sends Stop when it stops the job: the rank ends itself at once, wherever it runs,
// without waiting for mpirun to pass a signal on.
//
// Frames are tiny and bounded (kMaxPayload) so that a stray or hostile peer cannot
// make the server allocate: a length prefix above the bound is refused before any
// payload is read. decode_* check every field and throw FormatError naming what is
// wrong, so the server can log the reason and drop the connection.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::supervisor {

// 2: heartbeats carry a phase; 3: and work time; 4: notices; 5: dump requests;
// 6: a rank's error notice
inline constexpr std::uint16_t kProtocolVersion = 6;
// Largest payload either side accepts. A Hello with a 255-byte host name fits easily.
inline constexpr std::uint32_t kMaxPayload = 1024;
inline constexpr std::size_t kFrameHeader = 4;

enum class MessageKind : std::uint8_t {
  hello = 1,
  welcome = 2,
  refused = 3,
  heartbeat = 4,
  goodbye = 5,
  alive = 6,
  stop = 7,
  notice = 8,
  dump = 9
};

struct Hello {
  std::string token;          // the run's random token (TROUPE_RUN_TOKEN)
  std::string run_id;         // TROUPE_RUN_ID, so a rank of another run is told apart
  std::uint32_t restart = 0;  // TROUPE_RESTART the rank was started with
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  std::uint32_t pid = 0;
  std::string host;
};

struct Welcome {};

struct Refused {
  std::string reason;
};
// How a Refused reason starts when troupe-run evicted a connection still awaiting its
// Hello to make room for a newer one (heartbeat_server.hpp): not a verdict on the
// rank, which connects again.
inline constexpr std::string_view kEvictedReason = "evicted";

// What a rank is doing. Each phase has its own deadline in troupe-run
// (RunOptions::phase_timeouts): a ten-minute save is not a hang, a stuck collective in
// the middle of training still is.
enum class Phase : std::uint8_t {
  startup = 0,   // connected, before its first step (MPI, data, model)
  training = 1,  // steps; the hang timeout applies
  evaluation = 2,
  checkpoint_save = 3,
  checkpoint_load = 4,  // resume
  data_loading = 5,
};
inline constexpr int kPhases = 6;
std::string_view phase_name(Phase phase);
// "checkpoint_save" -> Phase::checkpoint_save; throws InvalidArgument naming the choices.
Phase parse_phase(std::string_view name);

// Progress as the rank last reported it. `step` and `sequence` are meaningful only
// when their flag is set (a rank that has not reached its first step has none).
struct Heartbeat {
  std::uint64_t step = 0;
  std::uint64_t sequence = 0;  // the last collective the rank entered
  bool has_step = false;
  bool has_sequence = false;
  Phase phase = Phase::startup;
  // The rank's own work over its timed steps so far: step time less the time spent
  // waiting for peers in collectives (SupervisorClient::report_step_work). troupe-run
  // compares ranks' work per step over a window to name stragglers.
  std::uint64_t work_us = 0;
  std::uint64_t work_steps = 0;
};

struct Goodbye {};

// troupe-run's answer to a Heartbeat: "I still hear you".
struct Alive {};

// troupe-run is stopping the job: end this rank now.
struct Stop {};

// troupe-run asks for this rank's flight record and thread stacks (a hang verdict, or
// SIGUSR1 to troupe-run): the rank writes them to its dump file (client.hpp).
struct Dump {};

// Something a rank wants in troupe-run's log: a checkpoint save that failed (with its
// errno and path), a fresh start it was asked for, or the error the rank is failing
// with, sent just before it drops the connection (SupervisorClient::abandon), so the
// failure names its cause even when mpirun's copy of the rank's stderr is lost.
enum class NoticeKind : std::uint8_t { save_failed = 1, started_fresh = 2, error = 3 };
inline constexpr int kNoticeKinds = 3;
std::string_view notice_name(NoticeKind kind);
// At most kMaxNoticeText bytes of text travel; the rest is cut.
inline constexpr std::size_t kMaxNoticeText = 700;
struct Notice {
  NoticeKind kind = NoticeKind::save_failed;
  std::string text;
};

using Message = std::variant<Hello, Welcome, Refused, Heartbeat, Goodbye, Alive, Stop, Notice, Dump>;

// A whole frame (length prefix included) ready to send.
std::vector<std::uint8_t> encode(const Message& message);

// The payload length in a frame header; throws FormatError when it is 0 or above
// kMaxPayload (the check that keeps a huge prefix from becoming an allocation).
std::uint32_t decode_length(const std::uint8_t header[kFrameHeader]);

// One payload (without its length prefix). Throws FormatError on an unknown kind, a
// field running past the end, or bytes left over.
Message decode_payload(const std::uint8_t* data, std::size_t size);

// "hello", "heartbeat", ... for messages and logs.
std::string_view kind_name(const Message& message);

}  // namespace troupe::supervisor
