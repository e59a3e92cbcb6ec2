#include "pointwise.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/loss.hpp"

namespace troupe::nn {

double accuracy(const Tensor& logits_in, const Tensor& target_in, std::int64_t ignore_index) {
  const char* op = "accuracy";
  // A report, not a training step: CUDA tensors are read back and counted here.
  const auto on_host = [](const Tensor& t) {
    return t.defined() && t.device().is_cuda() ? t.to(tensor::Device::cpu()) : t;
  };
  const Tensor logits = on_host(logits_in), target = on_host(target_in);
  detail::check_host_floating(logits, op);
  TROUPE_CHECK(logits.dim() >= 1, op, ": logits must have a class dimension");
  TROUPE_CHECK(target.defined() && target.dtype() == tensor::DType::i64 && target.device().is_cpu(), op,
               ": target must be an i64 tensor");
  const tensor::Shape rows_shape(logits.shape().begin(), logits.shape().end() - 1);
  TROUPE_CHECK(target.shape() == rows_shape, op, ": logits ", tensor::to_string(logits.shape()), " need target ",
               tensor::to_string(rows_shape), ", got ", tensor::to_string(target.shape()));
  const std::int64_t classes = logits.size(-1);
  const std::int64_t* y = target.data<std::int64_t>();
  std::int64_t counted = 0, correct = 0;
  tensor::dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.data<T>();
    for (std::int64_t r = 0; r < target.numel(); ++r) {
      if (y[r] == ignore_index || classes == 0) continue;
      const T* row = x + r * classes;
      std::int64_t best = 0;  // first maximum on ties, as argmax
      for (std::int64_t c = 1; c < classes; ++c)
        if (static_cast<double>(row[c]) > static_cast<double>(row[best])) best = c;
      ++counted;
      correct += best == y[r] ? 1 : 0;
    }
  });
  return counted > 0 ? static_cast<double>(correct) / static_cast<double>(counted) : 0.0;
}

}  // namespace troupe::nn
