// The NCCL backend in a build without CUDA or NCCL: it cannot be created.
#include "troupe/collectives/nccl_communicator.hpp"

#include "troupe/error.hpp"

namespace troupe::collectives {

namespace detail {
struct NcclState {};
}  // namespace detail

bool NcclCommunicator::available() { return false; }

NcclCommunicator::NcclCommunicator(MpiCommunicator& bootstrap, int, Options options)
    : Communicator(bootstrap.rank(), bootstrap.size(), options) {
  TROUPE_THROW(Error, "NCCL communicator on rank ", bootstrap.rank(),
               ": troupe was built without NCCL (configure with the CUDA toolkit and NCCL present)");
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<detail::NcclState> state, std::unique_ptr<Communicator> host,
                                   MPI_Comm check_comm, int rank, int size, Options options)
    : Communicator(rank, size, options), state_(std::move(state)), host_(std::move(host)), check_comm_(check_comm) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::device() const { return -1; }

std::unique_ptr<Communicator> NcclCommunicator::split(int, int) {
  TROUPE_THROW(Error, "troupe was built without NCCL");
}

Work NcclCommunicator::start(const Collective& c, bool) {
  TROUPE_THROW(Error, c.describe(), ": troupe was built without NCCL");
}

std::shared_ptr<Operation> NcclCommunicator::signed_operation(const Collective& c) {
  TROUPE_THROW(Error, c.describe(), ": troupe was built without NCCL");
}

}  // namespace troupe::collectives
