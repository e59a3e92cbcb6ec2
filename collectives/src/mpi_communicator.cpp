#include "troupe/collectives/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <vector>

#include "allreduce_ring.hpp"
#include "blocking_watchdog.hpp"
#include "board_call.hpp"
#include "engine.hpp"
#include "mpi_request_operation.hpp"
#include "packed_call.hpp"
#include "shm_channel.hpp"
#include "shm_collective.hpp"
#include "signature_check.hpp"
#include "troupe/collectives/collective_error.hpp"
#include "troupe/collectives/single_rank_communicator.hpp"
#include "troupe/keep_until_exit.hpp"
#include "troupe/mpi/mpi_error.hpp"
#include "troupe/tensor/dtype.hpp"

namespace troupe::collectives {

namespace {

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  return rank;
}
int comm_size(MPI_Comm comm) {
  int size = 0;
  TROUPE_MPI_CHECK(MPI_Comm_size(comm, &size));
  return size;
}
MPI_Comm dup(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_dup(comm, &copy));
  // Errors come back as codes, so TROUPE_MPI_CHECK can throw them with context
  // instead of MPI aborting the job.
  TROUPE_MPI_CHECK(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN));
  return copy;
}
bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm parent, Options options)
    : Communicator(comm_rank(parent), comm_size(parent), options) {
  comm_ = dup(parent);
  set_up();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, Options options, Adopt)
    : Communicator(comm_rank(comm), comm_size(comm), options), comm_(comm) {
  TROUPE_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  set_up();
}

void MpiCommunicator::set_up() {
  start_order_ = std::make_shared<detail::StartOrder>();
  p2p_comm_ = dup(comm_);
  check_comm_ = dup(comm_);
  int* tag_ub = nullptr;
  int flag = 0;
  TROUPE_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag));
  if (flag && tag_ub) tag_limit_ = *tag_ub;
  if (options().timeout != kNoTimeout) {
    watchdog_ = std::make_unique<detail::BlockingWatchdog>(options().timeout, rank(), size());
  }
  if (options().shared_memory) shm_ = detail::ShmChannel::create(comm_, options().shm_slot_bytes, options().shm_slots);
  if (watchdog_ && shm_ && options().check_signatures)
    watchdog_->set_mismatch_probe(
        [board = shm_.get()](const Collective& c) { return detail::board_verdict(*board, c).value_or(std::string()); });
}

MpiCommunicator::~MpiCommunicator() {
  drain();
  engine().stop();
  // A root's last broadcast on the board may not be verified yet: report it if it was wrong.
  if (shm_ && !failed())
    detail::settle_unverified(*shm_, std::min<std::chrono::milliseconds>(options().timeout, std::chrono::seconds(10)));
  // A collective abandoned after a timeout may still be matched by a late peer; freeing
  // its communicator under it would be undefined, so a failed communicator is leaked.
  // The same holds for the shared segments an abandoned collective may still read.
  if (engine().has_abandoned()) troupe::detail::keep_until_exit(shm_.release());
  if (!mpi_usable() || engine().has_abandoned()) return;
  for (MPI_Comm* comm : {&check_comm_, &p2p_comm_, &comm_}) {
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
  }
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  // The allgather is numbered, checked in debug mode and bounded by the timeout; once
  // it completes every rank is here, so the blocking MPI_Comm_split cannot hang.
  std::vector<std::int32_t> mine{color, key};
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(size()));
  allgather(Buffer(mine), Buffer(all));
  MPI_Comm child = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child));
  if (child == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<Communicator>(new MpiCommunicator(child, options(), Adopt{}));
}

void MpiCommunicator::check_host(const Collective& c, const Buffer& b, const char* which) const {
  TROUPE_CHECK(b.count == 0 || b.device.is_cpu(), c.describe(), ": the MPI backend needs host memory, but the ", which,
               " buffer is on ", b.device, " [rank ", rank(), "]; use the NCCL backend for CUDA buffers");
}

Work MpiCommunicator::start(const Collective& c, bool blocking) {
  check_host(c, c.input, "input");
  check_host(c, c.output, "output");
  TROUPE_CHECK(c.count <= static_cast<std::size_t>(INT_MAX), c.describe(), ": ", c.count,
               " elements exceed MPI's int count limit of ", INT_MAX, "; split the buffer");
  if (c.kind == CollectiveKind::send || c.kind == CollectiveKind::recv) {
    TROUPE_CHECK(c.tag <= tag_limit_, c.describe(), ": tag ", c.tag, " exceeds MPI_TAG_UB ", tag_limit_);
  } else if (options().debug) {
    try {
      detail::verify_signature(check_comm_, c, rank(), size(), options().timeout);
    } catch (const Error& e) {
      // The ranks are out of step (or one is missing); nothing after this can be trusted.
      fail(e.what());
      throw;
    }
  }
  if (try_direct(c, blocking)) return Work();
  try {
    return launch(signed_operation(c), blocking);
  } catch (const std::exception& e) {
    // A mismatch found as the call started, or a failure after its signature went out:
    // either way the ranks are out of step now.
    fail(e.what());
    throw;
  }
}

std::shared_ptr<Operation> MpiCommunicator::signed_operation(const Collective& c) {
  std::shared_ptr<Operation> op = operation_for(c);
  if (!options().check_signatures || c.is_point_to_point()) return op;
  // MPI's own non-blocking collectives start only once the signatures agree (see
  // with_signature_check); shared memory and the ring, troupe's own, start at once.
  const bool mpi_collective = dynamic_cast<detail::MpiRequestOperation*>(op.get()) != nullptr;
  return detail::with_signature_check(std::move(op), shm_.get(), check_comm_, rank(), size(), options().timeout,
                                      mpi_collective ? start_order_ : nullptr);
}

std::shared_ptr<Operation> MpiCommunicator::operation_for(const Collective& c) {
  if (shm_ && detail::ShmCollective::supports(c)) return std::make_shared<detail::ShmCollective>(c, *shm_);
  // Off one node: the pipelined ring for large allreduces, reduces and reduce_scatters
  // (an allreduce or a reduce needs an element per rank for its blocks); MPI's own
  // non-blocking call for the rest (allgather: see allreduce_ring.hpp for why not the
  // ring). A reduce decides by its count, which every rank has, not by a buffer that
  // ranks other than the root may leave empty.
  const bool whole = c.kind != CollectiveKind::reduce_scatter;
  const std::size_t min_count = whole ? static_cast<std::size_t>(size()) : 1;
  const std::size_t bytes = c.kind == CollectiveKind::reduce ? c.count * tensor::element_size(c.dtype)
                                                             : std::max(c.input.nbytes(), c.output.nbytes());
  const bool ring = detail::AllreduceRing::supports(c) && size() > 1 && c.count >= min_count &&
                    bytes >= options().ring_threshold_bytes;
  if (ring) {
    const int tag = static_cast<int>(c.sequence % (static_cast<std::uint64_t>(tag_limit_) + 1));
    return std::make_shared<detail::AllreduceRing>(c, comm_, rank(), size(), options().segment_bytes,
                                                   options().ring_window, tag);
  }
  return std::make_shared<detail::MpiRequestOperation>(c, detail::MpiSite{comm_, p2p_comm_, rank(), size()});
}

bool MpiCommunicator::try_direct(const Collective& c, bool blocking) {
  if (!blocking || options().debug || c.is_point_to_point()) return false;
  const std::size_t bytes = std::max(c.input.nbytes(), c.output.nbytes());
  if (bytes > options().direct_blocking_bytes) return false;
  // The choice of the blocking call must be the same on every rank -- MPI never matches
  // a blocking collective with a non-blocking one -- so it cannot depend on whether this
  // rank's earlier async work happens to be finished (a barrier after a dropped
  // allreduce deadlocked at 3 ranks that way). Every rank issued that work before this
  // call, so each finishes it first, then all take the blocking call.
  engine().wait_all(options().timeout);
  if (shm_ && options().check_signatures && detail::fits_on_board(c, size(), options().shm_board_bytes)) {
    try {
      detail::run_on_board(*shm_, c, options().timeout);
    } catch (const std::exception& e) {
      fail(c.describe() + " failed: " + e.what());
      throw;
    }
    return true;
  }
  if (watchdog_) watchdog_->begin(c);
  // The signature is checked with the call, not before it (every small call would wait
  // for the slowest rank twice): on one node on the board, published first and read
  // after; across nodes inside the call's own message where packed_call.hpp can, else
  // in a non-blocking all-reduce started first, which MPI matches with the same
  // exchange of a call that took the engine's path, and which completes during the
  // blocking call.
  std::unique_ptr<detail::SignatureExchange> exchange;
  try {
    // (On one node the board is cheaper: a store and a few reads, no message. The
    // packed call was measured there when it was an MPI_Allreduce with a user-defined
    // op: 2x the board's time at 4 KB.)
    if (options().check_signatures && !shm_ && detail::can_pack(c)) {
      detail::run_packed(c, detail::MpiSite{comm_, p2p_comm_, rank(), size()}, check_comm_, options().timeout);
      if (watchdog_) watchdog_->end();
      return true;
    }
    if (options().check_signatures) {
      if (shm_) {
        detail::publish_signature(*shm_, c, options().timeout);
      } else {
        exchange = std::make_unique<detail::SignatureExchange>(c);
        exchange->start(check_comm_);
      }
    }
    try {
      detail::run_mpi_blocking(c, detail::MpiSite{comm_, p2p_comm_, rank(), size()});
    } catch (...) {
      // Calls of different sizes can fail inside MPI: name the mismatch if that is it.
      if (exchange) detail::throw_if_mismatched(*exchange, check_comm_, c, rank(), size(), options().timeout);
      if (shm_ && options().check_signatures) detail::board_agrees(*shm_, c);
      throw;
    }
    if (exchange) {
      detail::finish_signature_check(*exchange, check_comm_, c, rank(), size(), options().timeout);
    } else if (shm_ && options().check_signatures) {
      // Every rank waits for every peer's entry, a broadcast's root too. (The board's
      // small broadcast defers its root's wait to a later call, board_call.hpp; the
      // calls here carry more than the board holds, and their data, not the round
      // trip, is their cost.)
      detail::wait_for_board(*shm_, c, options().timeout);
    }
  } catch (const std::exception& e) {
    if (watchdog_) watchdog_->end();
    troupe::detail::keep_until_exit(exchange.release());  // MPI may still write to it
    fail(c.describe() + " failed: " + e.what());
    throw;
  }
  if (watchdog_) watchdog_->end();
  return true;
}

std::unique_ptr<Communicator> world_communicator(Options options) {
  int size = 1;
  TROUPE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (size == 1) return std::make_unique<SingleRankCommunicator>(options);
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
}

}  // namespace troupe::collectives
