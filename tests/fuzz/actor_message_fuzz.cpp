// Fuzz target: an actor message as it arrives from MPI -- header, size table,
// attachments within the message, then the cereal payload of each kind (an error
// reply, a spawn, lookup or register request, or a call's arguments of several
// shapes, tensors included). The only failure allowed is a reported one: a dropped
// message or BadMessage. Anything else (a crash, an allocation the bytes cannot
// back, another exception) is a finding.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "transport.hpp"
#include "troupe/actors/detail/serialization.hpp"
#include "troupe/actors/errors.hpp"
#include "troupe/actors/spawn_options.hpp"
#include "troupe/tensor/serialize.hpp"
#include "wire.hpp"

using namespace troupe::actors;
using namespace troupe::actors::detail;

namespace {
template <class... T>
void parse_as(std::string_view payload) {
  std::tuple<T...> values;
  std::apply([&](auto&... v) { parse_exactly(payload, "fuzzed", v...); }, values);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Header h;
  if (!read_header(bytes, h).empty()) return 0;
  Message message{1, {}, {}};
  if (h.attachments > 0 && h.attachment_tag == kAttachedTag) {
    if (!split_attached(message, Bytes::copy_of(data, size))) return 0;
  } else {
    message.bytes.assign(bytes);
  }
  const std::string_view payload = std::string_view(message.bytes).substr(sizeof(Header));
  try {
    switch (h.kind) {
      case Kind::reply_error: parse_as<ErrorInfo>(payload); break;
      case Kind::spawn: parse_as<std::string, SpawnOptions, std::string>(payload); break;
      case Kind::lookup: parse_as<std::string>(payload); break;
      case Kind::register_name: parse_as<std::string, int, std::uint64_t, std::string>(payload); break;
      default:
        switch (h.method % 5) {
          case 0: parse_as<int>(payload); break;
          case 1: parse_as<std::string>(payload); break;
          case 2: parse_as<std::vector<std::string>, std::map<std::string, int>>(payload); break;
          case 3: parse_as<troupe::tensor::Tensor, double>(payload); break;
          case 4: parse_as<std::vector<char>, std::vector<double>>(payload); break;
        }
    }
  } catch (const BadMessage&) {
  }
  return 0;
}
