#include "troupe/tensor/dtype.hpp"

#include <ostream>
#include <string>

namespace troupe::tensor {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "invalid";
}

DType dtype_from_name(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},     {"float32", DType::f32}, {"float", DType::f32},     {"f64", DType::f64},
      {"float64", DType::f64}, {"double", DType::f64},  {"f16", DType::f16},       {"float16", DType::f16},
      {"half", DType::f16},    {"bf16", DType::bf16},   {"bfloat16", DType::bf16}, {"i32", DType::i32},
      {"int32", DType::i32},   {"int", DType::i32},     {"i64", DType::i64},       {"int64", DType::i64},
      {"long", DType::i64},    {"u8", DType::u8},       {"uint8", DType::u8},
  };
  for (const auto& alias : kAliases)
    if (alias.name == name) return alias.dtype;
  TROUPE_THROW(InvalidArgument, "unknown dtype '", name, "'; expected one of f32, f64, f16, bf16, i32, i64, u8");
}

std::ostream& operator<<(std::ostream& out, DType t) { return out << dtype_name(t); }

}  // namespace troupe::tensor
