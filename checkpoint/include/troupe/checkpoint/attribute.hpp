// Attribute values: the scalars and text a checkpoint stores next to its tensors (root
// metadata, sampler position, counters, hyper-parameters). Three kinds are enough and
// each maps onto a plain HDF5 type h5py reads natively: int64, float64, UTF-8 string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace troupe::checkpoint {

using AttrValue = std::variant<std::int64_t, double, std::string>;

// Insertion-ordered (name, value) pairs; a later set() of the same name replaces it.
class Attributes {
 public:
  void set(std::string name, AttrValue value);
  const AttrValue* find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // Typed access; throws FormatError naming the attribute when absent or of another kind.
  std::int64_t get_int(std::string_view name) const;
  double get_double(std::string_view name) const;  // an int64 value is accepted too
  const std::string& get_string(std::string_view name) const;

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::vector<std::pair<std::string, AttrValue>> entries_;
};

// "42", "0.001", "\"text\"": for messages and tools.
std::string to_string(const AttrValue& value);

}  // namespace troupe::checkpoint
