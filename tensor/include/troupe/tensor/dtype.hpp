// Element types of a tensor, their sizes and names, and `dispatch`, which turns a
// runtime DType into a compile-time element type for a kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string_view>
#include <type_traits>

#include "troupe/error.hpp"
#include "troupe/tensor/half.hpp"

namespace troupe::tensor {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::u8};

constexpr std::size_t element_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

// "f32", "bf16", ...: the names used in messages, checkpoints and flags.
std::string_view dtype_name(DType t);
// Inverse of dtype_name; also accepts PyTorch's spellings ("float32", "bfloat16", "int64").
DType dtype_from_name(std::string_view name);
std::ostream& operator<<(std::ostream& out, DType t);

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::u8;
};
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// The type arithmetic on T is done in: f16/bf16 compute in float, like PyTorch on CPU.
template <class T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<Half> {
  using type = float;
};
template <>
struct ComputeOf<BFloat16> {
  using type = float;
};
template <class T>
using compute_t = typename ComputeOf<T>::type;

// Calls f(T{}) with T the element type of t. f returns the same type for every T.
template <class F>
decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::f16: return f(Half{});
    case DType::bf16: return f(BFloat16{});
    case DType::i32: return f(std::int32_t{});
    case DType::i64: return f(std::int64_t{});
    case DType::u8: return f(std::uint8_t{});
  }
  TROUPE_THROW(InvalidArgument, "dispatch: corrupt dtype value ", static_cast<int>(t));
}

// Like dispatch, for operations defined on floating types only; `op` names the
// operation in the error for any other dtype.
template <class F>
decltype(auto) dispatch_floating(DType t, std::string_view op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::f16: return f(Half{});
    case DType::bf16: return f(BFloat16{});
    default: break;
  }
  TROUPE_THROW(InvalidArgument, op, ": needs a floating dtype (f32, f64, f16, bf16), got ", dtype_name(t));
}

}  // namespace troupe::tensor
