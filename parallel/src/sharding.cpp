#include "troupe/parallel/sharding.hpp"

#include <string>

#include "troupe/error.hpp"

namespace troupe::parallel {

Sharding parse_sharding(std::string_view name) {
  if (name == "ddp") return Sharding::ddp;
  if (name == "zero1") return Sharding::zero1;
  if (name == "zero2") return Sharding::zero2;
  if (name == "fsdp") return Sharding::fsdp;
  TROUPE_THROW(InvalidArgument, "unknown sharding mode '", std::string(name), "' (one of ddp, zero1, zero2, fsdp)");
}

const char* sharding_name(Sharding mode) {
  switch (mode) {
    case Sharding::ddp: return "ddp";
    case Sharding::zero1: return "zero1";
    case Sharding::zero2: return "zero2";
    case Sharding::fsdp: return "fsdp";
  }
  return "?";
}

}  // namespace troupe::parallel
