#include "troupe/checkpoint/attribute.hpp"

#include <sstream>

#include "troupe/error.hpp"

namespace troupe::checkpoint {

void Attributes::set(std::string name, AttrValue value) {
  for (auto& [key, v] : entries_) {
    if (key == name) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(name), std::move(value));
}

const AttrValue* Attributes::find(std::string_view name) const {
  for (const auto& [key, v] : entries_)
    if (key == name) return &v;
  return nullptr;
}

namespace {
const AttrValue& need(const Attributes& attrs, std::string_view name) {
  const AttrValue* v = attrs.find(name);
  if (!v) TROUPE_THROW(FormatError, "attribute '", name, "' is missing");
  return *v;
}
}  // namespace

std::int64_t Attributes::get_int(std::string_view name) const {
  const AttrValue& v = need(*this, name);
  if (const auto* i = std::get_if<std::int64_t>(&v)) return *i;
  TROUPE_THROW(FormatError, "attribute '", name, "' is ", to_string(v), ", not an integer");
}

double Attributes::get_double(std::string_view name) const {
  const AttrValue& v = need(*this, name);
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  TROUPE_THROW(FormatError, "attribute '", name, "' is ", to_string(v), ", not a number");
}

const std::string& Attributes::get_string(std::string_view name) const {
  const AttrValue& v = need(*this, name);
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  TROUPE_THROW(FormatError, "attribute '", name, "' is ", to_string(v), ", not a string");
}

std::string to_string(const AttrValue& value) {
  std::ostringstream out;
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    out << *i;
  } else if (const auto* d = std::get_if<double>(&value)) {
    out.precision(17);
    out << *d;
  } else {
    out << '"' << std::get<std::string>(value) << '"';
  }
  return out.str();
}

}  // namespace troupe::checkpoint
