#include "troupe/nn/sequential.hpp"

#include <string>

#include "troupe/error.hpp"

namespace troupe::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) append(std::move(m));
}

void Sequential::append(std::shared_ptr<Module> module) {
  layers_.push_back(&register_module(std::to_string(layers_.size()), std::move(module)));
}

Module& Sequential::operator[](std::size_t i) const {
  TROUPE_CHECK(i < layers_.size(), "Sequential: index ", i, " out of range for ", layers_.size(), " modules");
  return *layers_[i];
}

Tensor Sequential::forward_impl(const Tensor& input) {
  Tensor x = input;
  for (Module* layer : layers_) x = layer->forward(x);
  return x;
}

Tensor Sequential::backward_impl(const Tensor& grad_output) {
  Tensor g = grad_output;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) g = (*it)->backward(g);
  return g;
}

}  // namespace troupe::nn
