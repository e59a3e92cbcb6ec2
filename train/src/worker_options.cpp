#include "troupe/train/worker_options.hpp"

#include <algorithm>

namespace troupe::train {

std::vector<std::pair<std::string, double>> time_shares(const std::vector<EpochResult>& results) {
  double total = 0, wait = 0, data = 0, checkpoint = 0;
  for (const EpochResult& r : results) {
    total += r.seconds;
    wait += r.wait_seconds;
    data += r.data_seconds;
    checkpoint += r.checkpoint_seconds;
  }
  if (total <= 0) return {};
  const double compute = std::max(0.0, total - wait - data - checkpoint);
  return {{"compute_share", compute / total},
          {"comm_wait_share", wait / total},
          {"data_share", data / total},
          {"checkpoint_share", checkpoint / total}};
}

}  // namespace troupe::train
