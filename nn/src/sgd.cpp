#include "troupe/nn/sgd.hpp"

#include "troupe/error.hpp"
#include "troupe/tensor/fused_optim.hpp"

namespace troupe::nn {

namespace {

template <class C>
struct SgdConstants {
  C rate, wd, mu, damp;
  bool first;  // the momentum buffer starts as the gradient (PyTorch)
};

// PyTorch's single-tensor SGD over n elements. The options are template arguments so
// that each loop has no branch and vectorises (a branch per element kept the old one
// scalar: a quarter of a small MLP's step).
template <bool kDecay, bool kMomentum, bool kNesterov, class T, class C>
void sgd_loop(T* p, const T* g, T* b, std::int64_t n, const SgdConstants<C>& k) {
  for (std::int64_t i = 0; i < n; ++i) {
    const C pi = static_cast<C>(p[i]);
    C d = static_cast<C>(g[i]);
    if constexpr (kDecay) d = d + k.wd * pi;
    if constexpr (kMomentum) {
      const C bi = k.first ? d : k.mu * static_cast<C>(b[i]) + k.damp * d;
      b[i] = T(bi);
      d = kNesterov ? d + k.mu * bi : bi;
    }
    p[i] = T(pi - k.rate * d);
  }
}

template <class T, class C>
void sgd_run(T* p, const T* g, T* b, std::int64_t n, const SgdConstants<C>& k, bool decay, bool nesterov) {
  if (b == nullptr)
    return decay ? sgd_loop<true, false, false>(p, g, b, n, k) : sgd_loop<false, false, false>(p, g, b, n, k);
  if (nesterov) return decay ? sgd_loop<true, true, true>(p, g, b, n, k) : sgd_loop<false, true, true>(p, g, b, n, k);
  return decay ? sgd_loop<true, true, false>(p, g, b, n, k) : sgd_loop<false, true, false>(p, g, b, n, k);
}

}  // namespace

SGD::SGD(std::vector<NamedParameter> params, double lr, double momentum, double dampening, double weight_decay,
         bool nesterov)
    : Optimizer(std::move(params), lr, "SGD"),
      momentum_(momentum),
      dampening_(dampening),
      weight_decay_(weight_decay),
      nesterov_(nesterov) {
  check();
}

void SGD::check() const {
  TROUPE_CHECK(momentum_ >= 0, "SGD: momentum must be >= 0, got ", momentum_);
  TROUPE_CHECK(weight_decay_ >= 0, "SGD: weight_decay must be >= 0, got ", weight_decay_);
  TROUPE_CHECK(!nesterov_ || (momentum_ > 0 && dampening_ == 0),
               "SGD: nesterov needs momentum > 0 and dampening = 0, got momentum ", momentum_, ", dampening ",
               dampening_);
}

std::vector<std::pair<std::string, double>> SGD::hyper_parameters() const {
  return {{"momentum", momentum_},
          {"dampening", dampening_},
          {"weight_decay", weight_decay_},
          {"nesterov", nesterov_ ? 1.0 : 0.0}};
}

void SGD::set_hyper_parameter(const std::string& key, double value) {
  if (key == "momentum")
    momentum_ = value;
  else if (key == "dampening")
    dampening_ = value;
  else if (key == "weight_decay")
    weight_decay_ = value;
  else if (key == "nesterov")
    nesterov_ = value != 0;
  else
    TROUPE_THROW(InvalidArgument, "SGD: unknown hyper-parameter '", key, "'");
  check();
}

void SGD::update(const std::string& name, Parameter& param, StateDict& state) {
  const bool first = !state.contains("momentum_buffer");
  if (momentum_ != 0 && first) state.insert("momentum_buffer", allocate_state(param.data.shape(), param.data.dtype()));
  Tensor* buffer = momentum_ != 0 ? state.find("momentum_buffer") : nullptr;
  if (param.data.device().is_cuda()) {
    // Collected for finish_step(): one fused launch for every CUDA parameter
    // (tensor/fused_optim.hpp: these formulas, in f32); the buffer lives on the
    // parameter's device, moved there once if made on the host.
    TROUPE_CHECK(param.data.dtype() == DType::f32, "SGD.step '", name,
                 "': a CUDA parameter must be f32 "
                 "(keep f32 master weights for bf16/f16 models), got ",
                 param.data.dtype());
    if (buffer && buffer->device() != param.data.device()) *buffer = buffer->to(param.data.device());
    pending_.push_back({&param.data,
                        &param.grad,
                        buffer,
                        {.lr = lr(),
                         .momentum = momentum_,
                         .dampening = dampening_,
                         .weight_decay = weight_decay_,
                         .nesterov = nesterov_,
                         .first_step = first}});
    return;
  }
  tensor::dispatch_floating(param.data.dtype(), "SGD.step '" + name + "'", [&](auto tag) {
    using T = decltype(tag);
    using C = tensor::compute_t<T>;
    const SgdConstants<C> k{static_cast<C>(lr()), static_cast<C>(weight_decay_), static_cast<C>(momentum_),
                            static_cast<C>(1 - dampening_), first};
    T* b = buffer ? buffer->data<T>() : nullptr;
    sgd_run(param.data.data<T>(), param.grad.data<T>(), b, param.data.numel(), k, k.wd != C(0), nesterov_);
  });
}

void SGD::finish_step(bool completed) {
  const std::vector<tensor::SgdEntry> entries = std::move(pending_);
  pending_.clear();
  if (completed) tensor::fused_sgd_steps_(entries);
}

}  // namespace troupe::nn
