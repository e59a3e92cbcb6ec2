#include "troupe/nn/module.hpp"

#include <algorithm>
#include <any>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "troupe/error.hpp"

namespace troupe::nn {

namespace {

// "'a', 'b', 'c'"
std::string quoted_list(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (std::size_t i = 0; i < names.size(); ++i) out << (i ? ", '" : "'") << names[i] << "'";
  return out.str();
}

std::string describe(const Tensor& t) {
  return std::string(tensor::dtype_name(t.dtype())) + " " + tensor::to_string(t.shape());
}

}  // namespace

void Module::check_new_name(const std::string& name) const {
  TROUPE_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(),
               ": a parameter, buffer or child name must be non-empty and contain no '.', got '", name, "'");
  const auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& entry) { return entry.first == name; });
  };
  TROUPE_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), type_name(), ": name '", name,
               "' is already registered");
}

Parameter& Module::register_parameter(std::string name, Tensor data) {
  check_new_name(name);
  data.check_defined("register_parameter");
  owned_.push_back(std::make_unique<Parameter>(Parameter{std::move(data), Tensor()}));
  parameters_.emplace_back(std::move(name), owned_.back().get());
  return *parameters_.back().second;
}

Parameter& Module::register_shared_parameter(std::string name, Parameter& shared) {
  check_new_name(name);
  shared.data.check_defined("register_shared_parameter");
  ++shared.uses;
  parameters_.emplace_back(std::move(name), &shared);
  return shared;
}

Tensor& Module::register_buffer(std::string name, Tensor value) {
  check_new_name(name);
  buffers_.emplace_back(std::move(name), std::make_unique<Tensor>(std::move(value)));
  return *buffers_.back().second;
}

Module& Module::register_module(std::string name, std::shared_ptr<Module> child) {
  check_new_name(name);
  TROUPE_CHECK(child != nullptr, type_name(), ": child '", name, "' is null");
  TROUPE_CHECK(child.get() != this, type_name(), ": a module cannot be its own child ('", name, "')");
  // A child added after the hook was set still reports to it, under its full name.
  if (hook_) child->install_hook(hook_, hook_prefix_ + name + ".");
  if (deferred_) child->defer_weight_gradients(deferred_);
  children_.emplace_back(std::move(name), std::move(child));
  return *children_.back().second;
}

void Module::collect_parameters(const std::string& prefix, std::vector<NamedParameter>& out) const {
  for (const auto& [name, param] : parameters_) out.push_back({prefix + name, param});
  for (auto& [name, child] : children_) child->collect_parameters(prefix + name + ".", out);
}

void Module::collect_buffers(const std::string& prefix, std::vector<NamedBuffer>& out) {
  for (auto& [name, buffer] : buffers_) out.push_back({prefix + name, buffer.get()});
  for (auto& [name, child] : children_) child->collect_buffers(prefix + name + ".", out);
}

// Own parameters, own buffers, then children: torch.nn.Module.state_dict's order.
void Module::collect_state(const std::string& prefix, StateDict& out) const {
  for (const auto& [name, param] : parameters_) out.insert(prefix + name, param->data);
  for (const auto& [name, buffer] : buffers_) out.insert(prefix + name, *buffer);
  for (const auto& [name, child] : children_) child->collect_state(prefix + name + ".", out);
}

std::vector<NamedParameter> Module::named_parameters() {
  std::vector<NamedParameter> all;
  collect_parameters("", all);
  // A shared parameter once, under its first name (PyTorch's remove_duplicate).
  std::vector<NamedParameter> out;
  std::unordered_set<const Parameter*> seen;
  for (auto& named : all)
    if (seen.insert(named.param).second) out.push_back(std::move(named));
  return out;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (auto& named : named_parameters()) out.push_back(named.param);
  return out;
}

std::vector<NamedBuffer> Module::named_buffers() {
  std::vector<NamedBuffer> out;
  collect_buffers("", out);
  return out;
}

std::vector<NamedModule> Module::named_children() {
  std::vector<NamedModule> out;
  for (auto& [name, child] : children_) out.push_back({name, child.get()});
  return out;
}

std::int64_t Module::parameter_count() const {
  std::vector<NamedParameter> all;
  collect_parameters("", all);
  std::unordered_set<const Parameter*> seen;
  std::int64_t n = 0;
  for (const auto& named : all)
    if (seen.insert(named.param).second) n += named.param->data.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDict out;
  collect_state("", out);
  return out;
}

void Module::load_state_dict(const StateDict& dict, bool strict) {
  // Check everything first, so a failed load leaves the module untouched.
  const StateDict mine = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, target] : mine) {
    const Tensor* source = dict.find(name);
    if (source == nullptr) {
      missing.push_back(name);
    } else if (!source->defined()) {
      mismatched.push_back("'" + name + "' is undefined in the dict");
    } else if (source->shape() != target.shape() || source->dtype() != target.dtype()) {
      mismatched.push_back("'" + name + "' is " + describe(target) + " in the module but " + describe(*source) +
                           " in the dict");
    }
  }
  for (const auto& [name, source] : dict)
    if (!mine.contains(name)) unexpected.push_back(name);

  const bool fail = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (fail) {
    std::ostringstream why;
    const char* sep = "";
    if (strict && !missing.empty()) {
      why << missing.size() << " missing key(s): " << quoted_list(missing);
      sep = "; ";
    }
    if (strict && !unexpected.empty()) {
      why << sep << unexpected.size() << " unexpected key(s): " << quoted_list(unexpected);
      sep = "; ";
    }
    if (!mismatched.empty()) {
      why << sep << mismatched.size() << " shape/dtype mismatch(es): ";
      for (std::size_t i = 0; i < mismatched.size(); ++i) why << (i ? ", " : "") << mismatched[i];
    }
    TROUPE_THROW(InvalidArgument, "load_state_dict: cannot load into ", type_name(), ": ", why.str());
  }
  for (const auto& [name, target] : mine)
    if (const Tensor* source = dict.find(name)) {
      Tensor destination = target;  // a handle to the module's own storage
      destination.copy_(*source);
    }
}

Tensor Module::forward(const Tensor& input) {
  if (!hooks_) return checkpointed_forward(input);
  const std::shared_ptr<const ModuleHooks> hooks = hooks_;  // a hook may replace hooks_
  if (hooks->before_forward) hooks->before_forward();
  Tensor output = checkpointed_forward(input);
  if (hooks->after_forward) hooks->after_forward();
  return output;
}

Tensor Module::forward_for_backward(const Tensor& input) {
  const std::shared_ptr<const ModuleHooks> hooks = hooks_;  // a hook may replace hooks_
  if (hooks && hooks->before_forward) hooks->before_forward();
  // A checkpointed module below keeps only its input, as in forward.
  Tensor output = checkpointing_ && training_ ? checkpointed_forward(input) : forward_for_backward_impl(input);
  if (hooks && hooks->after_forward) hooks->after_forward();
  return output;
}

Tensor Module::backward(const Tensor& grad_output) {
  const std::shared_ptr<const ModuleHooks> hooks = hooks_;  // a hook may replace hooks_
  if (hooks && hooks->before_backward) hooks->before_backward();
  const bool recomputed = recompute_forward();
  Tensor grad_input = backward_impl(grad_output);
  // The recomputed caches served this one backward; keeping them would hold every
  // block's activations again by the end of the model's backward.
  if (recomputed) release_activations();
  if (hooks && hooks->after_backward) hooks->after_backward();
  return grad_input;
}

Tensor Module::checkpointed_forward(const Tensor& input) {
  recompute_pending_ = false;
  checkpoint_input_ = Tensor();
  if (!checkpointing_ || !training_) return forward_impl(input);
  std::vector<tensor::Generator*> generators;
  collect_generators(generators);
  std::vector<tensor::Generator> before;
  for (const tensor::Generator* g : generators) before.push_back(*g);
  Tensor output = forward_impl(input);
  release_activations();
  checkpoint_generators_ = std::move(before);
  checkpoint_input_ = input;
  recompute_pending_ = true;
  return output;
}

// The generators are wound back for the recompute and set again afterwards, so forwards
// that ran in between (a pipeline's other micro-batches) keep their draws.
bool Module::recompute_forward() {
  if (!recompute_pending_) return false;
  std::vector<tensor::Generator*> generators;
  collect_generators(generators);
  TROUPE_CHECK(generators.size() == checkpoint_generators_.size(), type_name(),
               ": the module's layers changed between a checkpointed forward and its backward");
  std::vector<tensor::Generator> now;
  for (std::size_t i = 0; i < generators.size(); ++i) {
    now.push_back(*generators[i]);
    *generators[i] = checkpoint_generators_[i];
  }
  const Tensor input = std::move(checkpoint_input_);
  checkpoint_input_ = Tensor();
  recompute_pending_ = false;
  forward_for_backward_impl(input);
  for (std::size_t i = 0; i < generators.size(); ++i) *generators[i] = now[i];
  return true;
}

ActivationStash Module::take_activations() {
  ActivationStash stash;
  exchange_activations(stash);
  return stash;
}

void Module::restore_activations(ActivationStash stash) {
  TROUPE_CHECK(!stash.restoring_ && !stash.slots_.empty(), type_name(),
               ".restore_activations: the stash was not taken from a module tree, or was restored already");
  stash.restoring_ = true;
  try {
    exchange_activations(stash);
  } catch (const std::bad_any_cast&) {
    TROUPE_THROW(InvalidArgument, type_name(), ".restore_activations: the stash was taken from another module tree");
  } catch (const std::out_of_range&) {
    TROUPE_THROW(InvalidArgument, type_name(), ".restore_activations: the stash holds ", stash.slots_.size(),
                 " fields, fewer than this tree takes: it was taken from another module tree");
  }
  TROUPE_CHECK(stash.next_ == stash.slots_.size(), type_name(), ".restore_activations: the stash holds ",
               stash.slots_.size(), " fields, this tree takes ", stash.next_);
}

// Every module's fields in one order (its own, then its children's in registration
// order), so a stash goes back where it came from.
void Module::exchange_activations(ActivationStash& stash) {
  exchange_own_activations(stash);
  stash.exchange(recompute_pending_);
  stash.exchange(checkpoint_input_);
  stash.exchange(checkpoint_generators_);
  for (auto& [name, child] : children_) child->exchange_activations(stash);
}

std::shared_ptr<Module> Module::shared_child(std::string_view name) const {
  for (const auto& [child_name, child] : children_)
    if (child_name == name) return child;
  return nullptr;
}

std::vector<std::string> Module::child_names() const {
  std::vector<std::string> names;
  for (const auto& [name, child] : children_) names.push_back(name);
  return names;
}

void Module::release_activations() {
  ActivationStash dropped;
  dropped.discarding_ = true;
  exchange_activations(dropped);
}

void Module::collect_generators(std::vector<tensor::Generator*>& out) {
  if (tensor::Generator* g = forward_generator()) out.push_back(g);
  for (auto& [name, child] : children_) child->collect_generators(out);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad(bool set_to_none) {
  for (auto& [name, param] : parameters_) {
    param->uses_done = 0;
    if (set_to_none)
      param->grad = Tensor();
    else if (param->grad.defined())
      param->grad.zero_();
  }
  for (auto& [name, child] : children_) child->zero_grad(set_to_none);
}

void Module::set_grad_ready_hook(GradReadyHook hook) {
  install_hook(hook ? std::make_shared<const GradReadyHook>(std::move(hook)) : nullptr, "");
}

void Module::defer_weight_gradients(WeightGradients* queue) {
  deferred_ = queue;
  for (auto& [name, child] : children_) child->defer_weight_gradients(queue);
}

void Module::install_hook(const SharedHook& hook, const std::string& prefix) {
  hook_ = hook;
  hook_prefix_ = prefix;
  for (auto& [name, child] : children_) child->install_hook(hook, prefix + name + ".");
}

void Module::grad_ready(Parameter& param) {
  if (param.uses > 1) {
    if (++param.uses_done < param.uses) return;
    param.uses_done = 0;
  }
  if (!hook_) return;
  for (auto& [name, mine] : parameters_)
    if (mine == &param) {
      (*hook_)(hook_prefix_ + name, param);
      return;
    }
  TROUPE_THROW(Error, type_name(), ": grad_ready called with a parameter this module did not register");
}

void Module::to(DType dtype) {
  TROUPE_CHECK(tensor::is_floating(dtype), type_name(), ".to: needs a floating dtype, got ", dtype);
  for (auto& param : owned_) {  // a shared one converts with its owner
    param->data = param->data.to(dtype);
    param->grad = Tensor();
  }
  for (auto& [name, buffer] : buffers_)
    if (buffer->defined() && tensor::is_floating(buffer->dtype())) *buffer = buffer->to(dtype);
  for (auto& [name, child] : children_) child->to(dtype);
}

void Module::to(Device device) {
  tensor::check_device_usable(device, (type_name() + ".to").c_str());
  for (auto& param : owned_) {
    param->data = param->data.to(device);
    param->grad = Tensor();
  }
  for (auto& [name, buffer] : buffers_)
    if (buffer->defined()) *buffer = buffer->to(device);
  for (auto& [name, child] : children_) child->to(device);
}

std::uint64_t parameter_hash(Module& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor host = p->data.to(tensor::Device::cpu());
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    for (std::size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace troupe::nn
