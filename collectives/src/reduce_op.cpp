#include "troupe/collectives/reduce_op.hpp"

#include <ostream>

namespace troupe::collectives {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
  }
  return "unknown-op";
}

std::ostream& operator<<(std::ostream& out, ReduceOp op) { return out << reduce_op_name(op); }

bool reduce_op_supports(ReduceOp op, DType dtype) { return op != ReduceOp::avg || tensor::is_floating(dtype); }

void check_reduce_op(ReduceOp op, DType dtype, std::string_view collective) {
  TROUPE_CHECK(static_cast<int>(op) <= static_cast<int>(ReduceOp::prod), collective, ": corrupt ReduceOp value ",
               static_cast<int>(op));
  TROUPE_CHECK(reduce_op_supports(op, dtype), collective, ": ", op, " is not defined on ", dtype,
               " (avg needs a floating dtype; for integers use sum and divide)");
}

}  // namespace troupe::collectives
