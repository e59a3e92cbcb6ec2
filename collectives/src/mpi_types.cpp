#include "mpi_types.hpp"

#include <mutex>

#include "reduce_kernels.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives::detail {

namespace {

// MPI calls these with (in, inout): inout[i] = in[i] op inout[i].
template <ReduceOp Op, DType D>
void user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce(Op, D, inout, in, inout, static_cast<std::size_t>(*len));
}

struct HalfOps {
  MPI_Op f16[4];
  MPI_Op bf16[4];
};

const HalfOps& half_ops() {
  static HalfOps ops;
  static std::once_flag once;
  std::call_once(once, [] {
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::sum, DType::f16>, 1, &ops.f16[0]));
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::max, DType::f16>, 1, &ops.f16[1]));
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::min, DType::f16>, 1, &ops.f16[2]));
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::prod, DType::f16>, 1, &ops.f16[3]));
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::sum, DType::bf16>, 1, &ops.bf16[0]));
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::max, DType::bf16>, 1, &ops.bf16[1]));
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::min, DType::bf16>, 1, &ops.bf16[2]));
    TROUPE_MPI_CHECK(MPI_Op_create(&user_op<ReduceOp::prod, DType::bf16>, 1, &ops.bf16[3]));
  });
  return ops;
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return 0;
    case ReduceOp::max: return 1;
    case ReduceOp::min: return 2;
    case ReduceOp::prod: return 3;
  }
  return 0;
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  TROUPE_THROW(InvalidArgument, "mpi_datatype: corrupt dtype value ", static_cast<int>(dtype));
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::f16) return half_ops().f16[op_index(op)];
  if (dtype == DType::bf16) return half_ops().bf16[op_index(op)];
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::prod: return MPI_PROD;
  }
  return MPI_SUM;
}

}  // namespace troupe::collectives::detail
