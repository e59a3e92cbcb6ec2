// ModuleList and ModuleDict: children held for their names, as torch.nn's.
//
// They give a module tree PyTorch's dotted names ("transformer.h.3.attn") without a
// computation of their own: the module that owns one runs its children itself, in
// whatever order its forward needs, and routes their gradients back in its backward.
// Their forward and backward are errors that say so.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "troupe/nn/module.hpp"

namespace troupe::nn {

class ModuleList : public Module {
 public:
  // Appends `module` as child "<size>" and returns it.
  template <class M>
  M& add(std::shared_ptr<M> module) {
    M& ref = *module;
    items_.push_back(&register_module(std::to_string(items_.size()), std::move(module)));
    return ref;
  }
  std::size_t size() const { return items_.size(); }
  Module& operator[](std::size_t i) const { return *items_.at(i); }

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override { return "ModuleList"; }

 private:
  std::vector<Module*> items_;
};

class ModuleDict : public Module {
 public:
  template <class M>
  M& add(std::string name, std::shared_ptr<M> module) {
    M& ref = *module;
    register_module(std::move(name), std::move(module));
    return ref;
  }

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override { return "ModuleDict"; }
};

}  // namespace troupe::nn
