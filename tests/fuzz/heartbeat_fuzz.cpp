// Fuzz target: a frame of troupe-run's heartbeat protocol from a peer (a rank, or
// anything that connects to the port). decode_length and decode_payload must either
// refuse it with FormatError or return a message that encodes back to the same bytes.
#include <cstdint>
#include <cstring>
#include <variant>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/supervisor/protocol.hpp"

using namespace troupe::supervisor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < kFrameHeader) return 0;
  try {
    const std::uint32_t length = decode_length(data);
    if (length > size - kFrameHeader) return 0;  // the server would wait for the rest
    const Message message = decode_payload(data + kFrameHeader, length);
    if (const auto* refused = std::get_if<Refused>(&message); refused && refused->reason.size() > 512)
      return 0;  // encode() cuts a refusal's reason at 512 bytes
    const std::vector<std::uint8_t> again = encode(message);
    if (again.size() != kFrameHeader + length || std::memcmp(again.data(), data, again.size()) != 0)
      __builtin_trap();  // decoded, but not what was sent: a field read wrongly
  } catch (const troupe::FormatError&) {
  }
  return 0;
}
