// Collective: the description of one call — which collective, its buffers, reduction
// and root — as the Communicator front end hands it to a backend. Debug mode compares
// its signature (kind, count, dtype, op, root) across ranks at every sequence number.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/collectives/buffer.hpp"
#include "troupe/collectives/reduce_op.hpp"

namespace troupe::collectives {

enum class CollectiveKind : std::uint8_t {
  allreduce,
  broadcast,
  reduce,
  allgather,
  reduce_scatter,
  gather,
  scatter,
  barrier,
  send,
  recv,
};

std::string_view collective_name(CollectiveKind kind);

struct Collective {
  CollectiveKind kind = CollectiveKind::barrier;
  // `input` is only read; `output` receives the result. An in-place call passes the
  // same buffer as both (the layouts are described at each Communicator method).
  Buffer input;
  Buffer output;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;  // broadcast/reduce/gather/scatter root; send/recv peer
  int tag = 0;   // send/recv only
  // Per-rank element count: what every rank must agree on (allgather: the input count).
  std::size_t count = 0;
  std::uint64_t sequence = 0;  // filled in by the Communicator
  // The input is the output (allreduce, broadcast, reduce) or the rank's own slice of
  // it (allgather, gather on root), or the output is the input's own slice
  // (reduce_scatter, scatter on root). Set by the Communicator.
  bool in_place = false;
  bool has_op() const {
    return kind == CollectiveKind::allreduce || kind == CollectiveKind::reduce ||
           kind == CollectiveKind::reduce_scatter;
  }
  bool has_root() const {
    return kind == CollectiveKind::broadcast || kind == CollectiveKind::reduce || kind == CollectiveKind::gather ||
           kind == CollectiveKind::scatter;
  }
  bool is_point_to_point() const { return kind == CollectiveKind::send || kind == CollectiveKind::recv; }
  // "allreduce #12 (sum, 1023 x bf16 = 2046 B)", for messages.
  std::string describe() const;
};

}  // namespace troupe::collectives
