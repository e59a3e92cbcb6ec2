// The element-wise reductions every CPU path shares: the ring's segment reductions
// and the user-defined MPI ops for f16/bf16.
//
// f16 and bf16 are combined in f32 and rounded back to 16 bits once per combine
// (round to nearest, ties to even). A sum over n ranks thus rounds n-1 times, once at
// each hop of the ring, in ring order — the same bits on every rank, since the
// allgather phase copies the one reduced block everywhere.
#pragma once

#include <cstddef>

#include "troupe/collectives/reduce_op.hpp"

namespace troupe::collectives::detail {

// dst[i] = (a[i] op b[i]) * scale for i < count. dst may be a or b. `scale` is
// applied to floating dtypes only (the last step of an avg) and is 1 otherwise.
// `op` must not be avg (callers reduce with sum and scale).
void reduce(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, std::size_t count, double scale = 1.0);

// out = part(0) op part(1) op ... op part(size - 1), combined in rank order so that
// every rank that runs it gets the same bits; an avg divides at the last combine.
// The partial sums go to `partial`, which may be `out` unless `out` is one of the parts.
template <class Part>
void reduce_in_rank_order(ReduceOp op, DType dtype, void* out, void* partial, std::size_t count, int size,
                          const Part& part) {
  const double last_scale = op == ReduceOp::avg ? 1.0 / size : 1.0;
  const auto into = [&](int q) { return q == size - 1 ? out : partial; };
  reduce(op, dtype, into(1), part(0), part(1), count, size == 2 ? last_scale : 1.0);
  for (int q = 2; q < size; ++q) reduce(op, dtype, into(q), partial, part(q), count, q == size - 1 ? last_scale : 1.0);
}

// data[i] *= factor, for floating dtypes (avg after an MPI sum).
void scale(DType dtype, void* data, std::size_t count, double factor);

}  // namespace troupe::collectives::detail
