// StateDict: an insertion-ordered map from names to tensors, the unit a model or an
// optimizer saves and loads ("0.weight" -> Tensor, "fc.bias/exp_avg" -> Tensor).
//
// Order is kept so that a saved file lists tensors in registration order, as
// PyTorch's OrderedDict does, and so two ranks that build the same model produce
// byte-identical dicts. Values are tensor handles: a dict returned by
// `Module::state_dict()` shares storage with the live parameters (as in PyTorch);
// clone() the values for a snapshot that later updates must not touch.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/tensor/tensor.hpp"

namespace troupe::nn {

using tensor::Tensor;

class StateDict {
 public:
  using Entry = std::pair<std::string, Tensor>;

  // Adds a new key; a key that is already present is an error naming it.
  void insert(std::string name, Tensor value);
  // Adds the key, or replaces the handle stored under it (keeping its position).
  void insert_or_assign(std::string name, Tensor value);

  // nullptr when absent.
  const Tensor* find(std::string_view name) const;
  Tensor* find(std::string_view name);
  // Throws InvalidArgument naming the key (and a few present keys) when absent.
  const Tensor& at(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<std::string> keys() const;

  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace troupe::nn
