#include "troupe/parallel/master_weights.hpp"

#include "troupe/error.hpp"

namespace troupe::parallel {

MasterWeights::MasterWeights(nn::Module& model) {
  for (const auto& [name, param] : model.named_parameters()) {
    TROUPE_CHECK(tensor::is_floating(param->data.dtype()), "MasterWeights: parameter '", name, "' is ",
                 param->data.dtype(), ", not a floating dtype");
    auto master = std::make_unique<nn::Parameter>();
    master->data = param->data.to(DType::f32).clone();  // clone: an f32 model's to() shares storage
    pairs_.push_back({name, param, std::move(master)});
  }
}

std::vector<nn::NamedParameter> MasterWeights::named_parameters() const {
  std::vector<nn::NamedParameter> out;
  for (const auto& pair : pairs_) out.push_back({pair.name, pair.master.get()});
  return out;
}

void MasterWeights::copy_gradients_to_master() {
  for (auto& pair : pairs_) {
    const Tensor& grad = pair.model->grad;
    if (!grad.defined()) {
      pair.master->grad = Tensor();
      continue;
    }
    if (!pair.master->grad.defined())
      pair.master->grad = Tensor::empty(pair.master->data.shape(), DType::f32, pair.master->data.device());
    pair.master->grad.copy_(grad);
  }
}

void MasterWeights::copy_master_to_model() {
  for (auto& pair : pairs_) pair.model->data.copy_(pair.master->data);
}

void MasterWeights::copy_model_to_master() {
  for (auto& pair : pairs_) pair.master->data.copy_(pair.model->data);
}

// The pair whose model parameter `value` is, under whichever of its names: a tied
// table is in a state dict twice (wte's and lm_head's), a parameter once.
const MasterWeights::Pair* MasterWeights::pair_of(const Tensor& value) const {
  if (!value.defined()) return nullptr;
  for (const auto& pair : pairs_)
    if (pair.model->data.defined() && pair.model->data.raw_data() == value.raw_data() &&
        pair.model->data.shape() == value.shape())
      return &pair;
  return nullptr;
}

nn::StateDict MasterWeights::state_dict(const nn::Module& model) const {
  nn::StateDict dict = model.state_dict();
  for (const auto& [name, value] : model.state_dict())
    if (const Pair* pair = pair_of(value)) dict.insert_or_assign(name, pair->master->data);
  return dict;
}

void MasterWeights::load_state_dict(nn::Module& model, const nn::StateDict& dict, bool strict) {
  // The model checks names, shapes and dtypes (its own) and rounds, every name of a
  // parameter; then the masters take the full-precision values.
  const nn::StateDict current = model.state_dict();
  nn::StateDict rounded;
  for (const auto& [name, value] : dict) {
    const Tensor* mine = current.find(name);
    const Pair* pair = mine != nullptr ? pair_of(*mine) : nullptr;
    const bool round = pair != nullptr && value.defined() && tensor::is_floating(value.dtype());
    rounded.insert(name, round ? value.to(pair->model->data.dtype()) : value);
  }
  model.load_state_dict(rounded, strict);
  for (auto& pair : pairs_)
    if (const Tensor* value = dict.find(pair.name)) pair.master->data.copy_(*value);
}

}  // namespace troupe::parallel
