#include "troupe/nn/state_dict.hpp"

#include <sstream>

#include "troupe/error.hpp"

namespace troupe::nn {

void StateDict::insert(std::string name, Tensor value) {
  TROUPE_CHECK(!contains(name), "StateDict::insert: key '", name, "' is already present");
  index_.emplace(name, entries_.size());
  entries_.emplace_back(std::move(name), std::move(value));
}

void StateDict::insert_or_assign(std::string name, Tensor value) {
  if (Tensor* existing = find(name)) {
    *existing = std::move(value);
    return;
  }
  insert(std::move(name), std::move(value));
}

const Tensor* StateDict::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

Tensor* StateDict::find(std::string_view name) {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const Tensor& StateDict::at(std::string_view name) const {
  if (const Tensor* t = find(name)) return *t;
  // Show a few keys so a prefix mix-up ("module.0.weight" vs "0.weight") is obvious.
  std::ostringstream some;
  constexpr std::size_t kShown = 5;
  for (std::size_t i = 0; i < entries_.size() && i < kShown; ++i) some << (i ? ", '" : "'") << entries_[i].first << "'";
  if (entries_.size() > kShown) some << ", ...";
  TROUPE_THROW(InvalidArgument, "StateDict::at: no key '", name, "' among ", entries_.size(), " keys (", some.str(),
               ")");
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, value] : entries_) out.push_back(name);
  return out;
}

}  // namespace troupe::nn
