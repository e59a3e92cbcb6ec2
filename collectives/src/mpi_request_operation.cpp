#include "mpi_request_operation.hpp"

#include <cstring>

#include "mpi_types.hpp"
#include "reduce_kernels.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives::detail {

void MpiRequestOperation::start() { post_mpi(collective(), site_, &request_); }

bool MpiRequestOperation::progress() {
  int flag = 0;
  MPI_Status status;
  TROUPE_MPI_CHECK(MPI_Test(&request_, &flag, &status));
  if (!flag) return false;
  finish_mpi(collective(), site_, status);
  return true;
}

std::string MpiRequestOperation::waiting_on() const {
  return collective().is_point_to_point() ? troupe::detail::concat("rank ", collective().root) : std::string();
}

void post_mpi(const Collective& c, const MpiSite& site, MPI_Request* r) {
  using K = CollectiveKind;
  const MPI_Datatype type = mpi_datatype(c.dtype);
  const int count = static_cast<int>(c.count);
  void* in = c.input.data;
  void* out = c.output.data;
  const MPI_Comm comm = site.comm;
  const bool is_root = site.rank == c.root;
  switch (c.kind) {
    case K::allreduce: {
      const MPI_Op op = mpi_op(c.op, c.dtype);
      const void* send = c.in_place ? MPI_IN_PLACE : in;
      TROUPE_MPI_CHECK(r ? MPI_Iallreduce(send, out, count, type, op, comm, r)
                         : MPI_Allreduce(send, out, count, type, op, comm));
      return;
    }
    case K::broadcast:
      if (is_root && !c.in_place && c.count > 0) std::memcpy(out, in, c.output.nbytes());
      TROUPE_MPI_CHECK(r ? MPI_Ibcast(out, count, type, c.root, comm, r) : MPI_Bcast(out, count, type, c.root, comm));
      return;
    case K::reduce: {
      const MPI_Op op = mpi_op(c.op, c.dtype);
      const void* send = is_root && c.in_place ? MPI_IN_PLACE : in;
      void* recv = is_root ? out : nullptr;
      TROUPE_MPI_CHECK(r ? MPI_Ireduce(send, recv, count, type, op, c.root, comm, r)
                         : MPI_Reduce(send, recv, count, type, op, c.root, comm));
      return;
    }
    case K::allgather: {
      const void* send = c.in_place ? MPI_IN_PLACE : in;
      const int send_count = c.in_place ? 0 : count;
      const MPI_Datatype send_type = c.in_place ? MPI_DATATYPE_NULL : type;
      TROUPE_MPI_CHECK(r ? MPI_Iallgather(send, send_count, send_type, out, count, type, comm, r)
                         : MPI_Allgather(send, send_count, send_type, out, count, type, comm));
      return;
    }
    case K::reduce_scatter: {
      // In place, MPI reads the whole buffer and leaves block 0's result at its start
      // (finish_mpi moves it to this rank's block).
      const MPI_Op op = mpi_op(c.op, c.dtype);
      const void* send = c.in_place ? MPI_IN_PLACE : in;
      void* recv = c.in_place ? in : out;
      TROUPE_MPI_CHECK(r ? MPI_Ireduce_scatter_block(send, recv, count, type, op, comm, r)
                         : MPI_Reduce_scatter_block(send, recv, count, type, op, comm));
      return;
    }
    case K::gather: {
      const void* send = is_root && c.in_place ? MPI_IN_PLACE : in;
      void* recv = is_root ? out : nullptr;
      TROUPE_MPI_CHECK(r ? MPI_Igather(send, count, type, recv, count, type, c.root, comm, r)
                         : MPI_Gather(send, count, type, recv, count, type, c.root, comm));
      return;
    }
    case K::scatter: {
      const void* send = is_root ? in : nullptr;
      void* recv = is_root && c.in_place ? MPI_IN_PLACE : out;
      TROUPE_MPI_CHECK(r ? MPI_Iscatter(send, count, type, recv, count, type, c.root, comm, r)
                         : MPI_Scatter(send, count, type, recv, count, type, c.root, comm));
      return;
    }
    case K::barrier: TROUPE_MPI_CHECK(r ? MPI_Ibarrier(comm, r) : MPI_Barrier(comm)); return;
    case K::send:
      TROUPE_CHECK(r, c.describe(), ": send/recv have no blocking fast path");
      TROUPE_MPI_CHECK(MPI_Isend(in, count, type, c.root, c.tag, site.p2p, r));
      return;
    case K::recv:
      TROUPE_CHECK(r, c.describe(), ": send/recv have no blocking fast path");
      TROUPE_MPI_CHECK(MPI_Irecv(out, count, type, c.root, c.tag, site.p2p, r));
      return;
  }
}

void finish_mpi(const Collective& c, const MpiSite& site, const MPI_Status& status) {
  using K = CollectiveKind;
  if (c.kind == K::recv) {
    int got = 0;
    TROUPE_MPI_CHECK(MPI_Get_count(&status, mpi_datatype(c.dtype), &got));
    TROUPE_CHECK(got == static_cast<int>(c.count), c.describe(), ": expected ", c.count, " elements from rank ", c.root,
                 ", got ", got);
    return;
  }
  if (c.kind == K::reduce_scatter && c.in_place && c.output.data != c.input.data && c.count > 0) {
    std::memmove(c.output.data, c.input.data, c.output.nbytes());
  }
  // avg is a sum followed by a division by the communicator size, where a result is.
  const bool has_result =
      c.kind == K::allreduce || c.kind == K::reduce_scatter || (c.kind == K::reduce && site.rank == c.root);
  if (c.op == ReduceOp::avg && c.has_op() && has_result) scale(c.dtype, c.output.data, c.count, 1.0 / site.size);
}

void run_mpi_blocking(const Collective& c, const MpiSite& site) {
  post_mpi(c, site, nullptr);
  finish_mpi(c, site, MPI_Status{});
}

}  // namespace troupe::collectives::detail
