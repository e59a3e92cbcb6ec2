// troupe dtypes and reductions as MPI datatypes and MPI_Ops.
//
// MPI has no 16-bit floats, so f16 and bf16 travel as MPI_UINT16_T and reduce through
// user-defined, commutative MPI_Ops that combine in f32 (reduce_kernels.hpp). They are
// created once per process, on first use, and left for MPI_Finalize to release.
#pragma once

#include <mpi.h>

#include "troupe/collectives/reduce_op.hpp"

namespace troupe::collectives::detail {

MPI_Datatype mpi_datatype(DType dtype);
// The MPI_Op for `op` on `dtype`; avg maps to sum (the caller divides afterwards).
MPI_Op mpi_op(ReduceOp op, DType dtype);

}  // namespace troupe::collectives::detail
