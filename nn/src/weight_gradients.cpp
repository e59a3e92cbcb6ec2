#include "troupe/nn/weight_gradients.hpp"

#include <utility>

namespace troupe::nn {

void WeightGradients::run() {
  std::vector<std::function<void()>> products = std::move(products_);
  products_.clear();
  for (auto& product : products) product();
}

}  // namespace troupe::nn
