#include "mpi_request_operation.hpp"

#include <cstring>

#include "mpi_types.hpp"
#include "reduce_kernels.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives::detail {

void MpiRequestOperation::start() { post_(&request_); }

bool MpiRequestOperation::progress() {
  int flag = 0;
  MPI_Status status;
  TROUPE_MPI_CHECK(MPI_Test(&request_, &flag, &status));
  if (!flag) return false;
  if (finish_) finish_(status);
  return true;
}

namespace {

void* in_place_or(const Collective& c, void* data) { return c.in_place ? MPI_IN_PLACE : data; }

// avg is a sum followed by a division by the communicator size.
MpiRequestOperation::Finish divide_if_avg(const Collective& c, void* data, std::size_t count, int size) {
  if (c.op != ReduceOp::avg) return {};
  const DType dtype = c.dtype;
  return [=](const MPI_Status&) { scale(dtype, data, count, 1.0 / size); };
}

}  // namespace

MpiCall make_mpi_call(const Collective& c, MPI_Comm comm, MPI_Comm p2p_comm, int rank, int size) {
  using K = CollectiveKind;
  using Post = MpiRequestOperation::Post;
  const MPI_Datatype type = mpi_datatype(c.dtype);
  const int count = static_cast<int>(c.count);
  void* in = c.input.data;
  void* out = c.output.data;
  Post post;
  MpiRequestOperation::Finish finish;
  std::string peer;
  switch (c.kind) {
    case K::allreduce: {
      const MPI_Op op = mpi_op(c.op, c.dtype);
      void* send = in_place_or(c, in);
      post = [=](MPI_Request* r) { TROUPE_MPI_CHECK(r ? MPI_Iallreduce(send, out, count, type, op, comm, r)
                            : MPI_Allreduce(send, out, count, type, op, comm)); };
      finish = divide_if_avg(c, out, c.count, size);
      break;
    }
    case K::broadcast: {
      const bool copy = rank == c.root && !c.in_place && c.count > 0;
      const std::size_t bytes = c.output.nbytes();
      const int root = c.root;
      post = [=](MPI_Request* r) {
        if (copy) std::memcpy(out, in, bytes);
        TROUPE_MPI_CHECK(r ? MPI_Ibcast(out, count, type, root, comm, r) : MPI_Bcast(out, count, type, root, comm));
      };
      break;
    }
    case K::reduce: {
      const MPI_Op op = mpi_op(c.op, c.dtype);
      const int root = c.root;
      const bool is_root = rank == root;
      void* send = is_root && c.in_place ? MPI_IN_PLACE : in;
      post = [=](MPI_Request* r) {
        void* recv = is_root ? out : nullptr;
        TROUPE_MPI_CHECK(r ? MPI_Ireduce(send, recv, count, type, op, root, comm, r)
                           : MPI_Reduce(send, recv, count, type, op, root, comm));
      };
      if (is_root) finish = divide_if_avg(c, out, c.count, size);
      break;
    }
    case K::allgather: {
      const bool in_place = c.in_place;
      post = [=](MPI_Request* r) {
        const void* send = in_place ? MPI_IN_PLACE : in;
        const int send_count = in_place ? 0 : count;
        const MPI_Datatype send_type = in_place ? MPI_DATATYPE_NULL : type;
        TROUPE_MPI_CHECK(r ? MPI_Iallgather(send, send_count, send_type, out, count, type, comm, r)
                           : MPI_Allgather(send, send_count, send_type, out, count, type, comm));
      };
      break;
    }
    case K::reduce_scatter: {
      const MPI_Op op = mpi_op(c.op, c.dtype);
      const bool in_place = c.in_place;
      post = [=](MPI_Request* r) {
        // In place, MPI reads the whole buffer and leaves block 0's result at its start.
        const void* send = in_place ? MPI_IN_PLACE : in;
        void* recv = in_place ? in : out;
        TROUPE_MPI_CHECK(r ? MPI_Ireduce_scatter_block(send, recv, count, type, op, comm, r)
                           : MPI_Reduce_scatter_block(send, recv, count, type, op, comm));
      };
      const std::size_t bytes = c.output.nbytes();
      auto avg = divide_if_avg(c, out, c.count, size);
      finish = [=](const MPI_Status& s) {
        if (in_place && out != in && bytes) std::memmove(out, in, bytes);
        if (avg) avg(s);
      };
      break;
    }
    case K::gather: {
      const int root = c.root;
      const bool is_root = rank == root;
      void* send = is_root && c.in_place ? MPI_IN_PLACE : in;
      post = [=](MPI_Request* r) {
        void* recv = is_root ? out : nullptr;
        TROUPE_MPI_CHECK(r ? MPI_Igather(send, count, type, recv, count, type, root, comm, r)
                           : MPI_Gather(send, count, type, recv, count, type, root, comm));
      };
      break;
    }
    case K::scatter: {
      const int root = c.root;
      const bool is_root = rank == root;
      void* recv = is_root && c.in_place ? MPI_IN_PLACE : out;
      post = [=](MPI_Request* r) {
        const void* send = is_root ? in : nullptr;
        TROUPE_MPI_CHECK(r ? MPI_Iscatter(send, count, type, recv, count, type, root, comm, r)
                           : MPI_Scatter(send, count, type, recv, count, type, root, comm));
      };
      break;
    }
    case K::barrier:
      post = [=](MPI_Request* r) { TROUPE_MPI_CHECK(r ? MPI_Ibarrier(comm, r) : MPI_Barrier(comm)); };
      break;
    case K::send: {
      const int to = c.root, tag = c.tag;
      post = [=](MPI_Request* r) { TROUPE_MPI_CHECK(MPI_Isend(in, count, type, to, tag, p2p_comm, r)); };
      peer = troupe::detail::concat("rank ", to);
      break;
    }
    case K::recv: {
      const int from = c.root, tag = c.tag;
      post = [=](MPI_Request* r) { TROUPE_MPI_CHECK(MPI_Irecv(out, count, type, from, tag, p2p_comm, r)); };
      const std::string what = c.describe();
      finish = [=](const MPI_Status& s) {
        int got = 0;
        TROUPE_MPI_CHECK(MPI_Get_count(&s, type, &got));
        TROUPE_CHECK(got == count, what, ": expected ", count, " elements from rank ", from, ", got ", got);
      };
      peer = troupe::detail::concat("rank ", from);
      break;
    }
  }
  return {std::move(post), std::move(finish), std::move(peer)};
}

std::shared_ptr<Operation> make_mpi_operation(const Collective& c, MPI_Comm comm, MPI_Comm p2p_comm, int rank,
                                              int size) {
  MpiCall call = make_mpi_call(c, comm, p2p_comm, rank, size);
  return std::make_shared<MpiRequestOperation>(c, std::move(call.post), std::move(call.finish), std::move(call.peer));
}

void run_mpi_blocking(const Collective& c, MPI_Comm comm, int rank, int size) {
  TROUPE_CHECK(!c.is_point_to_point(), c.describe(), ": send/recv have no blocking fast path");
  MpiCall call = make_mpi_call(c, comm, MPI_COMM_NULL, rank, size);
  call.post(nullptr);
  if (call.finish) {
    MPI_Status status{};
    call.finish(status);
  }
}

}  // namespace troupe::collectives::detail
