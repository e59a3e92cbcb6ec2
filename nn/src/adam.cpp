#include "troupe/nn/adam.hpp"

#include <cmath>

#include "troupe/error.hpp"
#include "troupe/tensor/fused_optim.hpp"

namespace troupe::nn {

Adam::Adam(std::vector<NamedParameter> params, double lr, Betas betas, double eps, double weight_decay)
    : Adam(std::move(params), lr, betas, eps, weight_decay, false) {}

Adam::Adam(std::vector<NamedParameter> params, double lr, Betas betas, double eps, double weight_decay, bool decoupled)
    : Optimizer(std::move(params), lr, decoupled ? "AdamW" : "Adam"),
      betas_(betas),
      eps_(eps),
      weight_decay_(weight_decay),
      decoupled_(decoupled) {
  check();
}

void Adam::check() const {
  TROUPE_CHECK(betas_.beta1 >= 0 && betas_.beta1 < 1 && betas_.beta2 >= 0 && betas_.beta2 < 1, type_name(),
               ": betas must be in [0, 1), got (", betas_.beta1, ", ", betas_.beta2, ")");
  TROUPE_CHECK(eps_ >= 0, type_name(), ": eps must be >= 0, got ", eps_);
  TROUPE_CHECK(weight_decay_ >= 0, type_name(), ": weight_decay must be >= 0, got ", weight_decay_);
}

std::vector<std::pair<std::string, double>> Adam::hyper_parameters() const {
  return {{"betas.0", betas_.beta1}, {"betas.1", betas_.beta2}, {"eps", eps_}, {"weight_decay", weight_decay_}};
}

void Adam::set_hyper_parameter(const std::string& key, double value) {
  if (key == "betas.0")
    betas_.beta1 = value;
  else if (key == "betas.1")
    betas_.beta2 = value;
  else if (key == "eps")
    eps_ = value;
  else if (key == "weight_decay")
    weight_decay_ = value;
  else
    TROUPE_THROW(InvalidArgument, type_name(), ": unknown hyper-parameter '", key, "'");
  check();
}

void Adam::update(const std::string& name, Parameter& param, StateDict& state) {
  if (!state.contains("step")) {
    state.insert("step", Tensor::zeros({}, DType::i64));
    state.insert("exp_avg", allocate_state(param.data.shape(), param.data.dtype()).zero_());
    state.insert("exp_avg_sq", allocate_state(param.data.shape(), param.data.dtype()).zero_());
  }
  std::int64_t& t = state.find("step")->data<std::int64_t>()[0];
  ++t;
  Tensor& exp_avg = *state.find("exp_avg");
  Tensor& exp_avg_sq = *state.find("exp_avg_sq");
  const std::vector<DecayRun> runs = decay_runs(name, param);
  // The fused steps' scalars for one run (tensor/fused_optim.hpp: the loop below's arithmetic).
  const auto fused_step = [&](const DecayRun& run) {
    return tensor::AdamStep{.lr = lr(),
                            .beta1 = betas_.beta1,
                            .beta2 = betas_.beta2,
                            .eps = eps_,
                            .weight_decay = run.weight_decay,
                            .decoupled = decoupled_,
                            .step = t};
  };
  if (param.data.device().is_cpu() && param.data.dtype() == DType::f32) {
    // The host's f32 loop, compiled for each instruction set (tensor/fused_optim.hpp),
    // with the same arithmetic as the loop below.
    for (const DecayRun& run : runs) {
      const tensor::AdamStep step = fused_step(run);
      if (runs.size() == 1) {
        tensor::fused_adam_step_(param.data, param.grad, exp_avg, exp_avg_sq, step);
        continue;
      }
      Tensor p = param.data.slice(run.begin, run.end), m = exp_avg.slice(run.begin, run.end),
             v = exp_avg_sq.slice(run.begin, run.end);
      tensor::fused_adam_step_(p, param.grad.slice(run.begin, run.end), m, v, step);
    }
    return;
  }
  if (param.data.device().is_cuda()) {
    // Collected for finish_step(): one fused launch for every CUDA parameter
    // (tensor/fused_optim.hpp: these formulas, in f32). The moments live on the
    // parameter's device; made or loaded on the host, they move once.
    TROUPE_CHECK(param.data.dtype() == DType::f32, type_name(), ".step '", name,
                 "': a CUDA parameter must be f32 "
                 "(keep f32 master weights for bf16/f16 models), got ",
                 param.data.dtype());
    for (Tensor* moment : {&exp_avg, &exp_avg_sq})
      if (moment->device() != param.data.device()) *moment = moment->to(param.data.device());
    for (const DecayRun& run : runs) {
      const tensor::AdamStep step = fused_step(run);
      if (runs.size() == 1) {
        pending_.push_back({&param.data, &param.grad, &exp_avg, &exp_avg_sq, step});
        continue;
      }
      Tensor* views[4];
      for (int k = 0; const Tensor* whole : {&param.data, &param.grad, &exp_avg, &exp_avg_sq})
        views[k++] = &pending_views_.emplace_back(whole->slice(run.begin, run.end));
      pending_.push_back({views[0], views[1], views[2], views[3], step});
    }
    return;
  }
  // The bias corrections are scalars, computed in double as PyTorch does in Python.
  const double bias_correction1 = 1 - std::pow(betas_.beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(betas_.beta2, static_cast<double>(t));
  const double step_size = lr() / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  tensor::dispatch_floating(param.data.dtype(), type_name() + ".step '" + name + "'", [&](auto tag) {
    using T = decltype(tag);
    using C = tensor::compute_t<T>;
    const C beta1 = static_cast<C>(betas_.beta1), beta2 = static_cast<C>(betas_.beta2);
    // 1 - beta in double, then rounded: in f32, 1 - float(0.999) would be off by 1e-5
    // relative. PyTorch also passes these weights from Python doubles.
    const C one_minus_beta1 = static_cast<C>(1 - betas_.beta1), one_minus_beta2 = static_cast<C>(1 - betas_.beta2);
    const C eps = static_cast<C>(eps_);
    const C size = static_cast<C>(step_size), bc2_sqrt = static_cast<C>(bias_correction2_sqrt);
    T* p = param.data.data<T>();
    const T* g = param.grad.data<T>();
    T* m = exp_avg.data<T>();
    T* v = exp_avg_sq.data<T>();
    for (const DecayRun& run : runs) {
      const C wd = static_cast<C>(run.weight_decay);
      const C decay = static_cast<C>(1 - lr() * run.weight_decay);
      for (std::int64_t i = run.begin; i < run.end; ++i) {
        C pi = static_cast<C>(p[i]);
        C gi = static_cast<C>(g[i]);
        if (decoupled_)
          pi = pi * decay;
        else if (wd != 0)
          gi = gi + wd * pi;
        const C mi = beta1 * static_cast<C>(m[i]) + one_minus_beta1 * gi;
        const C vi = beta2 * static_cast<C>(v[i]) + one_minus_beta2 * gi * gi;
        m[i] = T(mi);
        v[i] = T(vi);
        const C denom = std::sqrt(vi) / bc2_sqrt + eps;
        p[i] = T(pi - size * mi / denom);
      }
    }
  });
}

// One run for a model's own parameter; for a flat shard, one per stretch of segments
// the filter treats alike. Padding past the last segment holds zeros: decay or not,
// it stays zero.
std::vector<Adam::DecayRun> Adam::decay_runs(const std::string& name, const Parameter& param) const {
  const std::int64_t n = param.data.numel();
  if (!decays_ || weight_decay_ == 0) return {{0, n, weight_decay_}};
  if (param.segments.empty()) return {{0, n, decays_(name, param.data.shape()) ? weight_decay_ : 0.0}};
  std::vector<DecayRun> runs;
  const auto add = [&](std::int64_t begin, std::int64_t end, double weight_decay) {
    if (begin == end) return;
    if (!runs.empty() && runs.back().weight_decay == weight_decay)
      runs.back().end = end;
    else
      runs.push_back({begin, end, weight_decay});
  };
  std::int64_t at = 0;
  for (const ParameterSegment& segment : param.segments) {
    TROUPE_CHECK(segment.begin >= at && segment.begin <= segment.end && segment.end <= n, type_name(), ".step '", name,
                 "': segment '", segment.name, "' [", segment.begin, ", ", segment.end,
                 ") is out of order or outside the ", n, " elements");
    add(at, segment.begin, runs.empty() ? 0.0 : runs.back().weight_decay);
    add(segment.begin, segment.end, decays_(segment.name, segment.shape) ? weight_decay_ : 0.0);
    at = segment.end;
  }
  add(at, n, runs.empty() ? 0.0 : runs.back().weight_decay);
  return runs;
}

void Adam::finish_step(bool completed) {
  // Cleared whatever happens, so no stale pointers reach the next step.
  const std::vector<tensor::AdamEntry> entries = std::move(pending_);
  pending_.clear();
  const std::deque<Tensor> views = std::move(pending_views_);  // alive through the launch
  pending_views_.clear();
  if (completed) tensor::fused_adam_steps_(entries);
}

}  // namespace troupe::nn
