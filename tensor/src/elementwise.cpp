// Elementwise arithmetic and comparisons. Each operation is a small functor applied
// by one of two drivers: `binary` (broadcasting, new output or in place) and
// `unary`. Values are loaded in the compute type (float for f16/bf16) and rounded
// once on store.
#include <cmath>
#include <type_traits>

#include "broadcast.hpp"
#include "convert.hpp"
#include "cuda/cuda_backend.hpp"
#include "math_loops.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::tensor {

namespace {

using detail::convert;
using detail::load;

struct Add {
  template <class C>
  C operator()(C x, C y) const {
    return x + y;
  }
};
struct Sub {
  template <class C>
  C operator()(C x, C y) const {
    return x - y;
  }
};
struct Mul {
  template <class C>
  C operator()(C x, C y) const {
    return x * y;
  }
};
struct Div {
  template <class C>
  C operator()(C x, C y) const {
    return x / y;
  }
};
struct Eq {
  template <class C>
  bool operator()(C x, C y) const {
    return x == y;
  }
};
struct Ne {
  template <class C>
  bool operator()(C x, C y) const {
    return x != y;
  }
};
struct Lt {
  template <class C>
  bool operator()(C x, C y) const {
    return x < y;
  }
};
struct Le {
  template <class C>
  bool operator()(C x, C y) const {
    return x <= y;
  }
};
struct Gt {
  template <class C>
  bool operator()(C x, C y) const {
    return x > y;
  }
};
struct Ge {
  template <class C>
  bool operator()(C x, C y) const {
    return x >= y;
  }
};

template <class Op>
constexpr bool kIsComparison = std::is_same_v<std::invoke_result_t<Op, int, int>, bool>;

template <class T>
void check_no_integer_division_by_zero(const Tensor& b, const char* op) {
  if constexpr (std::is_integral_v<T>) {
    const T* p = b.data<T>();
    for (std::int64_t i = 0; i < b.numel(); ++i)
      TROUPE_CHECK(p[i] != 0, op, ": integer division by zero at element ", i, " of the divisor");
  }
}

template <class Op>
cuda_backend::BinaryOp cuda_op() {
  using B = cuda_backend::BinaryOp;
  if constexpr (std::is_same_v<Op, Add>)
    return B::add;
  else if constexpr (std::is_same_v<Op, Sub>)
    return B::sub;
  else if constexpr (std::is_same_v<Op, Mul>)
    return B::mul;
  else if constexpr (std::is_same_v<Op, Div>)
    return B::div;
  else if constexpr (std::is_same_v<Op, Eq>)
    return B::eq;
  else if constexpr (std::is_same_v<Op, Ne>)
    return B::ne;
  else if constexpr (std::is_same_v<Op, Lt>)
    return B::lt;
  else if constexpr (std::is_same_v<Op, Le>)
    return B::le;
  else if constexpr (std::is_same_v<Op, Gt>)
    return B::gt;
  else
    return B::ge;
}

// a op b on the GPU: equal shapes and a one-element b take the flat kernel; every other
// broadcast (a bias row, a column, a one-element a, ...) the strided one, with each
// operand's strides over the output's dimensions.
template <class Op>
void binary_cuda(const detail::BroadcastPlan& plan, const Tensor& a, const Tensor& b, Tensor& out, const char* name) {
  using Kind = detail::BroadcastPlan::Kind;
  if constexpr (std::is_same_v<Op, Div>) {
    // A GPU does not trap on integer division by zero; check the divisor on the host.
    if (!is_floating(a.dtype()))
      dispatch(b.dtype(),
               [&](auto tag) { check_no_integer_division_by_zero<decltype(tag)>(b.to(Device::cpu()), name); });
  }
  if (plan.kind == Kind::same || plan.kind == Kind::scalar_b) {
    cuda_backend::binary(cuda_op<Op>(), a.dtype(), a.raw_data(), b.raw_data(), plan.kind == Kind::scalar_b,
                         out.raw_data(), out.numel());
    return;
  }
  const auto nd = plan.out_shape.size();
  TROUPE_CHECK(nd <= static_cast<std::size_t>(cuda_backend::kMaxBroadcastDims), name, " on ", a.device(),
               ": broadcasting over ", nd, " dimensions, CUDA kernels take at most ", cuda_backend::kMaxBroadcastDims,
               " (shapes ", to_string(a.shape()), " and ", to_string(b.shape()), ")");
  cuda_backend::BroadcastIndex index;
  index.nd = static_cast<int>(nd);
  const auto sa = detail::broadcast_strides(a.shape(), plan.out_shape);
  const auto sb = detail::broadcast_strides(b.shape(), plan.out_shape);
  for (std::size_t d = 0; d < nd; ++d) {
    index.out_shape[d] = plan.out_shape[d];
    index.a_strides[d] = sa[d];
    index.b_strides[d] = sb[d];
  }
  cuda_backend::binary_broadcast(cuda_op<Op>(), a.dtype(), a.raw_data(), b.raw_data(), index, out.raw_data(),
                                 out.numel());
}

// out = a op b; `out` is undefined for a new result, or `a` itself for the in-place form.
template <class Op>
Tensor binary(const Tensor& a, const Tensor& b, const char* name, Tensor* in_place) {
  const detail::BroadcastPlan plan = detail::plan_broadcast(a, b, name);
  if (in_place)
    TROUPE_CHECK(plan.out_shape == a.shape(), name, "_: result shape ", to_string(plan.out_shape),
                 " differs from the in-place target's ", to_string(a.shape()));
  constexpr bool kCompare = kIsComparison<Op>;
  Tensor out = in_place ? *in_place : Tensor::empty(plan.out_shape, kCompare ? DType::u8 : a.dtype(), a.device());
  if (out.numel() == 0) return out;
  if (a.device().is_cuda()) {
    binary_cuda<Op>(plan, a, b, out, name);
    return out;
  }
  dispatch(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<Op, Div>) check_no_integer_division_by_zero<T>(b, name);
    if constexpr (kCompare) {
      detail::apply_binary(plan, a.data<T>(), b.data<T>(), out.data<std::uint8_t>(),
                           [](T x, T y) { return static_cast<std::uint8_t>(Op{}(load(x), load(y))); });
    } else {
      detail::apply_binary(plan, a.data<T>(), b.data<T>(), out.data<T>(),
                           [](T x, T y) { return convert<T>(Op{}(load(x), load(y))); });
    }
  });
  return out;
}

// A one-element tensor of a's dtype and device holding `value`.
Tensor scalar_like(const Tensor& a, double value) {
  a.check_defined("scalar");
  return Tensor::full({}, value, a.dtype(), a.device());
}

// out = f(t) elementwise; floating dtypes only unless `any_dtype`. On CUDA the kernel
// applies `op` (with lo/hi for clamp), the same formula as f.
template <class F>
Tensor unary(const Tensor& t, const char* name, cuda_backend::UnaryOp op, F f, bool any_dtype = false,
             Tensor* in_place = nullptr, double lo = 0, double hi = 0) {
  t.check_defined(name);
  TROUPE_CHECK(any_dtype || is_floating(t.dtype()), name, ": needs a floating dtype, got ", t.dtype());
  Tensor out = in_place ? *in_place : Tensor::empty(t.shape(), t.dtype(), t.device());
  if (t.device().is_cuda()) {
    if (t.numel() > 0) cuda_backend::unary(op, t.dtype(), t.raw_data(), out.raw_data(), t.numel(), lo, hi);
    return out;
  }
  dispatch(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = t.data<T>();
    T* o = out.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) o[i] = convert<T>(f(load(in[i])));
  });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary<Add>(a, b, "add", nullptr); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary<Sub>(a, b, "sub", nullptr); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary<Mul>(a, b, "mul", nullptr); }
Tensor div(const Tensor& a, const Tensor& b) { return binary<Div>(a, b, "div", nullptr); }
Tensor add(const Tensor& a, double b) { return binary<Add>(a, scalar_like(a, b), "add", nullptr); }
Tensor mul(const Tensor& a, double b) { return binary<Mul>(a, scalar_like(a, b), "mul", nullptr); }
Tensor& add_(Tensor& a, const Tensor& b) {
  binary<Add>(a, b, "add", &a);
  return a;
}
Tensor& sub_(Tensor& a, const Tensor& b) {
  binary<Sub>(a, b, "sub", &a);
  return a;
}
Tensor& mul_(Tensor& a, const Tensor& b) {
  binary<Mul>(a, b, "mul", &a);
  return a;
}
Tensor& div_(Tensor& a, const Tensor& b) {
  binary<Div>(a, b, "div", &a);
  return a;
}
Tensor& add_(Tensor& a, double b) {
  binary<Add>(a, scalar_like(a, b), "add", &a);
  return a;
}

Tensor eq(const Tensor& a, const Tensor& b) { return binary<Eq>(a, b, "eq", nullptr); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary<Ne>(a, b, "ne", nullptr); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary<Lt>(a, b, "lt", nullptr); }
Tensor le(const Tensor& a, const Tensor& b) { return binary<Le>(a, b, "le", nullptr); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary<Gt>(a, b, "gt", nullptr); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary<Ge>(a, b, "ge", nullptr); }
Tensor gt(const Tensor& a, double b) { return binary<Gt>(a, scalar_like(a, b), "gt", nullptr); }
Tensor lt(const Tensor& a, double b) { return binary<Lt>(a, scalar_like(a, b), "lt", nullptr); }

Tensor& axpy_(Tensor& y, double alpha, const Tensor& x) {
  y.check_defined("axpy_");
  x.check_defined("axpy_");
  TROUPE_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape() && y.device() == x.device(), "axpy_: y is ", y.dtype(),
               " ", to_string(y.shape()), " on ", y.device(), ", x is ", x.dtype(), " ", to_string(x.shape()), " on ",
               x.device(), "; they must match");
  if (y.device().is_cuda()) {
    cuda_backend::axpy(y.dtype(), y.raw_data(), alpha, x.raw_data(), y.numel());
    return y;
  }
  dispatch(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const C a = static_cast<C>(alpha);
    T* py = y.data<T>();
    const T* px = x.data<T>();
    for (std::int64_t i = 0; i < y.numel(); ++i) py[i] = convert<T>(load(py[i]) + a * load(px[i]));
  });
  return y;
}

Tensor& scale_(Tensor& t, double alpha) {
  t.check_defined("scale_");
  if (t.device().is_cuda()) {
    cuda_backend::scale(t.dtype(), t.raw_data(), alpha, t.numel());
    return t;
  }
  dispatch(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const C a = static_cast<C>(alpha);
    T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = convert<T>(load(p[i]) * a);
  });
  return t;
}

using U = cuda_backend::UnaryOp;

Tensor neg(const Tensor& t) {
  return unary(
      t, "neg", U::neg, [](auto x) { return -x; }, true);
}
Tensor abs(const Tensor& t) {
  return unary(
      t, "abs", U::abs, [](auto x) { return x < decltype(x){0} ? -x : x; }, true);
}
Tensor sqrt(const Tensor& t) {
  return unary(t, "sqrt", U::sqrt, [](auto x) { return std::sqrt(x); });
}
Tensor exp(const Tensor& t) {
  return unary(t, "exp", U::exp, [](auto x) { return std::exp(x); });
}
Tensor log(const Tensor& t) {
  return unary(t, "log", U::log, [](auto x) { return std::log(x); });
}
Tensor tanh(const Tensor& t) {
  return unary(t, "tanh", U::tanh, [](auto x) { return std::tanh(x); });
}
Tensor sigmoid(const Tensor& t) {
  return unary(t, "sigmoid", U::sigmoid, [](auto x) { return decltype(x)(1) / (decltype(x)(1) + std::exp(-x)); });
}
Tensor relu(const Tensor& t) {
  return unary(t, "relu", U::relu, [](auto x) { return x > decltype(x)(0) ? x : decltype(x)(0); });
}

Tensor gelu(const Tensor& t, bool tanh_approximation) {
  // nn's GELU formulas (nn/src/activation.cpp), in the compute type.
  if (tanh_approximation) {
    // 0.5 (1 + tanh(u)) is sigmoid(2u): one exp instead of tanh, whose libm form
    // (through expm1) costs three times as much. exp overflowing to inf gives 0, not NaN.
    if (t.defined() && t.device().is_cpu() && t.dtype() == DType::f32) {
      Tensor out = Tensor::empty(t.shape(), t.dtype());
      detail::math_loops()->gelu_tanh(t.data<float>(), out.data<float>(), t.numel());
      return out;
    }
    return unary(t, "gelu", U::gelu_tanh, [](auto x) {
      using C = decltype(x);
      const C u = C(0.7978845608028654) * (x + C(0.044715) * x * x * x);
      return x / (C(1) + std::exp(C(-2) * u));
    });
  }
  return unary(t, "gelu", U::gelu, [](auto x) {
    using C = decltype(x);
    return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476)));
  });
}

Tensor clamp(const Tensor& t, double lo, double hi) {
  Tensor out = t.clone();
  return clamp_(out, lo, hi);
}

Tensor& clamp_(Tensor& t, double lo, double hi) {
  TROUPE_CHECK(!(lo > hi), "clamp: lower bound ", lo, " is above upper bound ", hi);
  // NaN stays NaN, as in PyTorch: both comparisons are false for it.
  unary(
      t, "clamp", U::clamp,
      [lo, hi](auto x) {
        using C = decltype(x);
        return x < static_cast<C>(lo) ? static_cast<C>(lo) : (x > static_cast<C>(hi) ? static_cast<C>(hi) : x);
      },
      true, &t, lo, hi);
  return t;
}

}  // namespace troupe::tensor
