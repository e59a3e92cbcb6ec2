#include "mpi_route.hpp"

#include "blocking_watchdog.hpp"
#include "mpi_request_operation.hpp"
#include "shm_channel.hpp"
#include "signature_check.hpp"
#include "troupe/keep_until_exit.hpp"

namespace troupe::collectives::detail {

// A blocking call's proof: started before the call, finished after it, asked after a failure.
class MpiBlockingRoute::Check {
 public:
  Check(const RouteSite& site, const Collective& c) : site_(site), c_(c) {
    if (!site_.options->check_signatures) return;
    if (site_.shm) {
      publish_signature(*site_.shm, c_, site_.options->timeout);
    } else {
      exchange_ = std::make_unique<SignatureExchange>(c_);
      exchange_->start(site_.check_comm);
    }
  }
  Check(const Check&) = delete;
  Check& operator=(const Check&) = delete;
  // MPI may still write to an exchange whose wait timed out.
  ~Check() { troupe::detail::keep_until_exit(exchange_.release()); }

  // After the call: every rank waits for every peer's entry, a broadcast's root too.
  // (The board route defers a small broadcast root's wait to a later call; the calls
  // here carry more than the board holds, and their data, not the round trip, is
  // their cost.)
  void verify() {
    if (exchange_) {
      finish_signature_check(*exchange_, site_.check_comm, c_, site_.mpi.rank, site_.mpi.size, site_.options->timeout);
      exchange_.reset();
    } else if (site_.shm && site_.options->check_signatures) {
      wait_for_board(*site_.shm, c_, site_.options->timeout);
    }
  }
  // After the call failed: throws the mismatch if that is what it was.
  void explain_failure() {
    if (exchange_)
      throw_if_mismatched(*exchange_, site_.check_comm, c_, site_.mpi.rank, site_.mpi.size, site_.options->timeout);
    if (site_.shm && site_.options->check_signatures) board_agrees(*site_.shm, c_);
  }

 private:
  const RouteSite& site_;
  const Collective& c_;
  std::unique_ptr<SignatureExchange> exchange_;
};

std::shared_ptr<Operation> MpiBlockingRoute::run(const Collective& c) {
  const WatchedCall watched(site().watchdog, c);
  Check check(site(), c);
  try {
    run_mpi_blocking(c, site().mpi);
  } catch (...) {
    check.explain_failure();
    throw;
  }
  check.verify();
  return nullptr;
}

std::shared_ptr<Operation> MpiRoute::run(const Collective& c) {
  return verify(std::make_shared<MpiRequestOperation>(c, site().mpi), c);
}

}  // namespace troupe::collectives::detail
