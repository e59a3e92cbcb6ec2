// A minimal JSON writer for --json output: enough for objects, arrays, strings and
// numbers, with strings escaped and NaN/Inf written as null (JSON has neither).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/json_string.hpp"

namespace troupe::ckpt_tool {

using troupe::json_string;
std::string json_number(double v);
std::string json_int(std::int64_t v);
std::string json_array(const std::vector<std::string>& items);

// Builds {"k": v, ...} in insertion order from already-encoded values.
class JsonObject {
 public:
  JsonObject& add(std::string_view key, std::string encoded_value);
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

}  // namespace troupe::ckpt_tool
