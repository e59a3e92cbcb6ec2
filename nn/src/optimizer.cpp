#include "troupe/nn/optimizer.hpp"

#include <sstream>
#include <unordered_map>

#include "troupe/error.hpp"

namespace troupe::nn {

namespace {

std::string dtype_and_shape(const Tensor& t) {
  return std::string(tensor::dtype_name(t.dtype())) + " " + tensor::to_string(t.shape());
}

}  // namespace

Optimizer::Optimizer(std::vector<NamedParameter> params, double lr, const char* type)
    : params_(std::move(params)), state_(params_.size()), lr_(lr) {
  TROUPE_CHECK(lr >= 0, type, ": learning rate must be >= 0, got ", lr);
  std::unordered_map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, param] = params_[i];
    TROUPE_CHECK(param != nullptr, type, ": parameter '", name, "' is null");
    TROUPE_CHECK(param->data.defined(), type, ": parameter '", name, "' has no data");
    TROUPE_CHECK(tensor::is_floating(param->data.dtype()), type, ": parameter '", name, "' is ", param->data.dtype(),
                 ", needs a floating dtype");
    TROUPE_CHECK(name.find('/') == std::string::npos, type, ": parameter name '", name,
                 "' contains '/', which separates names from slots in state_dict keys");
    const auto [it, fresh] = seen.emplace(name, i);
    TROUPE_CHECK(fresh, type, ": parameter name '", name, "' appears twice (positions ", it->second, " and ", i, ")");
  }
}

void Optimizer::set_lr(double lr) {
  TROUPE_CHECK(lr >= 0, type_name(), ": learning rate must be >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::step() {
  try {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& [name, param] = params_[i];
      if (!param->grad.defined()) continue;
      TROUPE_CHECK(param->grad.shape() == param->data.shape() && param->grad.dtype() == param->data.dtype(),
                   type_name(), ".step: the gradient of '", name, "' is ", dtype_and_shape(param->grad),
                   ", the parameter is ", dtype_and_shape(param->data));
      // CPU parameters step in host loops, CUDA ones in tensor's fused kernels (SGD, Adam).
      TROUPE_CHECK(param->grad.device() == param->data.device(), type_name(), ".step: '", name, "' is on ",
                   param->data.device(), ", its gradient on ", param->grad.device());
      update(name, *param, state_[i]);
    }
  } catch (...) {
    finish_step(false);
    throw;
  }
  finish_step(true);
  ++step_count_;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& [name, param] : params_) {
    if (set_to_none)
      param->grad = Tensor();
    else if (param->grad.defined())
      param->grad.zero_();
  }
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  out.insert("lr", Tensor::full({}, lr_, DType::f64));
  out.insert("step", Tensor::full({}, static_cast<double>(step_count_), DType::i64));
  for (const auto& [key, value] : hyper_parameters()) out.insert(key, Tensor::full({}, value, DType::f64));
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (const Slot& slot : slots())
      if (const Tensor* t = state_[i].find(slot.name)) out.insert(params_[i].name + "/" + slot.name, t->clone());
  return out;
}

void Optimizer::load_state_dict(const StateDict& dict) { load(dict, false); }

void Optimizer::adopt_state_dict(StateDict dict) { load(dict, true); }

void Optimizer::load(const StateDict& dict, bool adopt) {
  std::vector<std::string> problems;
  const auto scalar = [&](const std::string& key, DType dtype) -> const Tensor* {
    const Tensor* t = dict.find(key);
    if (t == nullptr)
      problems.push_back("missing '" + key + "'");
    else if (!t->defined() || t->numel() != 1 || t->dtype() != dtype)
      problems.push_back("'" + key + "' must be one " + std::string(tensor::dtype_name(dtype)) + " value, got " +
                         (t->defined() ? dtype_and_shape(*t) : "undefined"));
    else
      return t;
    return nullptr;
  };
  scalar("lr", DType::f64);
  scalar("step", DType::i64);
  for (const auto& [key, value] : hyper_parameters()) scalar(key, DType::f64);

  std::unordered_map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < params_.size(); ++i) by_name.emplace(params_[i].name, i);
  const std::vector<Slot> known = slots();
  for (const auto& [key, value] : dict) {
    const auto cut = key.rfind('/');
    if (cut == std::string::npos) {
      if (key == "lr" || key == "step") continue;
      bool hyper = false;
      for (const auto& [name, v] : hyper_parameters()) hyper = hyper || name == key;
      if (!hyper) problems.push_back("unexpected key '" + key + "'");
      continue;
    }
    const auto param = by_name.find(key.substr(0, cut));
    const std::string slot_name = key.substr(cut + 1);
    const Slot* slot = nullptr;
    for (const Slot& s : known) slot = s.name == slot_name ? &s : slot;
    if (param == by_name.end() || slot == nullptr) {
      problems.push_back("unexpected key '" + key + "'");
      continue;
    }
    const Tensor& data = params_[param->second].param->data;
    const bool ok = value.defined() && (slot->scalar ? value.numel() == 1 && value.dtype() == DType::i64
                                                     : value.shape() == data.shape() && value.dtype() == data.dtype());
    if (!ok)
      problems.push_back("'" + key + "' is " + (value.defined() ? dtype_and_shape(value) : "undefined") +
                         ", expected " + (slot->scalar ? "one i64 value" : dtype_and_shape(data)));
  }
  // A parameter has all of its slots or none (never stepped yet).
  for (const auto& [name, param] : params_) {
    std::vector<std::string> present, absent;
    for (const Slot& s : known) (dict.contains(name + "/" + s.name) ? present : absent).push_back(s.name);
    if (!present.empty() && !absent.empty())
      problems.push_back("incomplete state for '" + name + "': has '" + present.front() + "', lacks '" +
                         absent.front() + "'");
  }
  if (!problems.empty()) {
    std::ostringstream why;
    for (std::size_t i = 0; i < problems.size(); ++i) why << (i ? "; " : "") << problems[i];
    TROUPE_THROW(InvalidArgument, type_name(), ".load_state_dict: ", problems.size(), " problem(s): ", why.str());
  }

  set_lr(dict.at("lr").item());
  step_count_ = static_cast<std::int64_t>(dict.at("step").item());
  for (const auto& [key, value] : hyper_parameters()) set_hyper_parameter(key, dict.at(key).item());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    state_[i] = StateDict();
    for (const Slot& s : known)
      if (const Tensor* t = dict.find(params_[i].name + "/" + s.name)) {
        if (!allocate_ || s.scalar) {
          state_[i].insert(s.name, adopt ? *t : t->clone());
        } else {
          Tensor copy = allocate_state(t->shape(), t->dtype());
          copy.copy_(*t);
          state_[i].insert(s.name, copy);
        }
      }
  }
}

}  // namespace troupe::nn
