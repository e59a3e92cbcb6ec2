// Sequential: modules applied one after another, torch.nn.Sequential.
//
// Children are named "0", "1", ... in the order added, so parameter names match
// PyTorch's ("0.weight", "2.bias"). backward runs the children in reverse, each
// firing its grad-ready hooks, so gradients become final last layer first.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "troupe/nn/module.hpp"

namespace troupe::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);

  // Appends a module and returns it with its own type:
  //   auto& fc = model.add(std::make_shared<Linear>(4, 8, gen));
  template <class M>
  M& add(std::shared_ptr<M> module) {
    M& ref = *module;
    append(std::move(module));
    return ref;
  }
  template <class M, class... Args>
  M& emplace(Args&&... args) {
    return add(std::make_shared<M>(std::forward<Args>(args)...));
  }

  std::size_t size() const { return layers_.size(); }
  Module& operator[](std::size_t i) const;

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override { return "Sequential"; }

 private:
  void append(std::shared_ptr<Module> module);
  std::vector<Module*> layers_;  // owned through the registered children
};

}  // namespace troupe::nn
