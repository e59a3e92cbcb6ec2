#include "troupe/collectives/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <vector>

#include "allreduce_ring.hpp"
#include "blocking_watchdog.hpp"
#include "board_route.hpp"
#include "engine.hpp"
#include "mpi_route.hpp"
#include "packed_route.hpp"
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
  route_site_ = std::make_unique<detail::RouteSite>(detail::RouteSite{detail::MpiSite{comm_, p2p_comm_, rank(), size()},
                                                                      check_comm_, tag_limit_, &options(), shm_.get(),
                                                                      watchdog_.get(), start_order_});
  // In the order they are asked: the small blocking routes first, the operations the
  // engine advances after, MpiRoute (which carries every call) last.
  routes_.push_back(std::make_unique<detail::BoardRoute>(*route_site_));
  routes_.push_back(std::make_unique<detail::PackedRoute>(*route_site_));
  routes_.push_back(std::make_unique<detail::MpiBlockingRoute>(*route_site_));
  routes_.push_back(std::make_unique<detail::ShmRoute>(*route_site_));
  routes_.push_back(std::make_unique<detail::RingRoute>(*route_site_));
  routes_.push_back(std::make_unique<detail::MpiRoute>(*route_site_));
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
  detail::Route& route = choose_route(c, blocking);
  if (!route.on_caller()) {
    try {
      return launch(route.run(c), blocking);
    } catch (const std::exception& e) {
      // A mismatch found as the call started, or a failure after its signature went
      // out: either way the ranks are out of step now.
      fail(e.what());
      throw;
    }
  }
  // MPI never matches a blocking collective with a non-blocking one, so the choice of a
  // route that finishes here cannot depend on whether this rank's earlier async work
  // happens to be done (a barrier after a dropped allreduce deadlocked at 3 ranks that
  // way): every rank issued that work before this call, so each finishes it first.
  engine().wait_all(options().timeout);
  try {
    route.run(c);
  } catch (const std::exception& e) {
    fail(c.describe() + " failed: " + e.what());
    throw;
  }
  return Work();
}

detail::Route& MpiCommunicator::choose_route(const Collective& c, bool blocking) const {
  for (const std::unique_ptr<detail::Route>& route : routes_)
    if (route->supports(c, blocking)) return *route;
  TROUPE_THROW(Error, c.describe(), ": no route carries it");  // unreachable: MpiRoute carries every call
}

std::string_view MpiCommunicator::route_name(const Collective& c, bool blocking) const {
  return choose_route(c, blocking).name();
}

std::unique_ptr<Communicator> world_communicator(Options options) {
  int size = 1;
  TROUPE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (size == 1) return std::make_unique<SingleRankCommunicator>(options);
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
}

}  // namespace troupe::collectives
