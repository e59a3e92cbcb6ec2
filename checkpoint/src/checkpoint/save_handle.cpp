#include "troupe/checkpoint/save_handle.hpp"

#include "troupe/error.hpp"

namespace troupe::checkpoint {

SaveHandle SaveHandle::skipped_save(std::int64_t step) {
  SaveHandle h;
  h.step_ = step;
  return h;
}

bool SaveHandle::test() const {
  return skipped() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void SaveHandle::wait(std::chrono::milliseconds timeout) const {
  if (skipped()) return;
  if (done_.wait_for(timeout) != std::future_status::ready)
    TROUPE_THROW(TimeoutError, "checkpoint save of step ", step_, " still writing after ", timeout.count(), " ms");
}

std::filesystem::path SaveHandle::get() const {
  TROUPE_CHECK(!skipped(), "checkpoint save of step ", step_,
               " was skipped (another save was writing); it has no file");
  return done_.get();
}

}  // namespace troupe::checkpoint
