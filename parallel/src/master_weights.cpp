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

nn::StateDict MasterWeights::state_dict(const nn::Module& model) const {
  nn::StateDict dict = model.state_dict();
  for (const auto& pair : pairs_) dict.insert_or_assign(pair.name, pair.master->data);
  return dict;
}

void MasterWeights::load_state_dict(nn::Module& model, const nn::StateDict& dict, bool strict) {
  // The model checks names, shapes and dtypes (its own) and rounds; then the masters
  // take the full-precision values.
  nn::StateDict rounded;
  for (const auto& [name, value] : dict) rounded.insert(name, value);
  for (const auto& pair : pairs_) {
    const Tensor* value = dict.find(pair.name);
    if (value != nullptr && value->defined() && tensor::is_floating(value->dtype()))
      rounded.insert_or_assign(pair.name, value->to(pair.model->data.dtype()));
  }
  model.load_state_dict(rounded, strict);
  for (auto& pair : pairs_)
    if (const Tensor* value = dict.find(pair.name)) pair.master->data.copy_(*value);
}

}  // namespace troupe::parallel
