#include "troupe/error.hpp"
#include "troupe/nn/loss.hpp"

namespace troupe::nn {

CrossEntropyLoss::CrossEntropyLoss(std::int64_t ignore_index, double label_smoothing)
    : ignore_index_(ignore_index), label_smoothing_(label_smoothing) {
  TROUPE_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
               "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", label_smoothing);
}

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& target) {
  forward_ = tensor::cross_entropy_forward(logits, target, ignore_index_, label_smoothing_, "CrossEntropyLoss.forward");
  logits_ = logits;
  return forward_.loss;
}

Tensor CrossEntropyLoss::backward(double scale) const {
  TROUPE_CHECK(logits_.defined(), "CrossEntropyLoss.backward: called before forward");
  return tensor::cross_entropy_backward(logits_, forward_, ignore_index_, label_smoothing_, scale);
}

}  // namespace troupe::nn
