// The reductions a collective can apply, and which dtypes each is defined for.
//
//   sum, max, min, prod: every dtype. Integers wrap as in C++ unsigned arithmetic for
//     u8 (prod of u8 is taken modulo 256) and as two's complement for i32/i64; f16 and
//     bf16 combine two values at a time in f32 and round the result back to 16 bits
//     (see docs/COLLECTIVES.md, "f16 and bf16").
//   avg: floating dtypes only. It is the sum divided by the communicator's size; on
//     integers it would have to pick a rounding, so it is rejected instead (sum and
//     divide yourself).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>

#include "troupe/tensor/dtype.hpp"

namespace troupe::collectives {

using tensor::DType;

enum class ReduceOp : std::uint8_t { sum, avg, max, min, prod };

// "sum", "avg", ...
std::string_view reduce_op_name(ReduceOp op);
std::ostream& operator<<(std::ostream& out, ReduceOp op);

// Whether `op` is defined on `dtype` (see above).
bool reduce_op_supports(ReduceOp op, DType dtype);

// Throws InvalidArgument naming `collective` when `op` is not defined on `dtype`.
void check_reduce_op(ReduceOp op, DType dtype, std::string_view collective);

}  // namespace troupe::collectives
