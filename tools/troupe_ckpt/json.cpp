#include "json.hpp"

#include <cmath>
#include <cstdio>

namespace troupe::ckpt_tool {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string json_int(std::int64_t v) { return std::to_string(v); }

std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

JsonObject& JsonObject::add(std::string_view key, std::string encoded_value) {
  fields_.emplace_back(std::string(key), std::move(encoded_value));
  return *this;
}

std::string JsonObject::str() const {
  std::string out = "{";
  for (std::size_t i = 0; i < fields_.size(); ++i)
    out += (i ? ", " : "") + json_string(fields_[i].first) + ": " + fields_[i].second;
  return out + "}";
}

}  // namespace troupe::ckpt_tool
