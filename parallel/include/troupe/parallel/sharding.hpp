// Sharding: how a data-parallel model and its optimizer state are spread over the ranks
// (sharded_model.hpp tells each mode): the worker's one option for it.
#pragma once

#include <string_view>

namespace troupe::parallel {

enum class Sharding { ddp, zero1, zero2, fsdp };

// From the names a command line uses ("ddp", "zero1", "zero2", "fsdp"); anything else is
// an InvalidArgument listing them.
Sharding parse_sharding(std::string_view name);
const char* sharding_name(Sharding mode);

}  // namespace troupe::parallel
