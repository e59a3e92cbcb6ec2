// SingleRankCommunicator: the backend for a world of one rank. Every collective is the
// identity on its data (a copy when out of place; avg, sum, max, min and prod of one
// value are that value) and completes before the call returns, so it costs a memcpy
// at most and never touches MPI. send/recv to oneself are refused: with one rank they
// can only deadlock.
#pragma once

#include <memory>
#include <string_view>

#include "troupe/collectives/communicator.hpp"

namespace troupe::collectives {

class SingleRankCommunicator : public Communicator {
 public:
  explicit SingleRankCommunicator(Options options = options_from_environment());

  std::string_view backend() const override { return "single-rank"; }
  std::unique_ptr<Communicator> split(int color, int key) override;

 protected:
  Work start(const Collective& collective, bool blocking) override;
};

}  // namespace troupe::collectives
