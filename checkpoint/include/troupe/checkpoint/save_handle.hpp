// SaveHandle: what Checkpoint::save_async returns, waited on like every troupe handle.
//
// The save goes on whether or not anyone holds the handle; dropping it is fine (an
// error is then only reported through the Checkpoint's warning handler). A skipped save
// (SaveOptions::if_busy = skip while another was writing) is complete at once and has
// no path.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <future>

namespace troupe::checkpoint {

class SaveHandle {
 public:
  SaveHandle() = default;
  SaveHandle(std::int64_t step, std::shared_future<std::filesystem::path> done) : step_(step), done_(std::move(done)) {}
  static SaveHandle skipped_save(std::int64_t step);

  std::int64_t step() const { return step_; }
  bool skipped() const { return !done_.valid(); }
  // True once the file is durable, the save failed, or it was skipped. Never blocks.
  bool test() const;
  // Waits at most `timeout`; throws TimeoutError naming the step when it runs out.
  void wait(std::chrono::milliseconds timeout) const;
  // Waits without a limit; returns the durable file's path, or rethrows the save's
  // error. A skipped save throws InvalidArgument.
  std::filesystem::path get() const;

 private:
  std::int64_t step_ = -1;
  std::shared_future<std::filesystem::path> done_;
};

}  // namespace troupe::checkpoint
