#include "troupe/collectives/work.hpp"

#include "engine.hpp"
#include "troupe/collectives/operation.hpp"

namespace troupe::collectives {

bool Work::test() {
  if (!operation_ || operation_->done()) return true;
  if (operation_->engine_) operation_->engine_->progress();
  return operation_->done();
}

bool Work::is_completed() const { return !operation_ || operation_->done(); }

bool Work::is_success() const { return is_completed() && !exception(); }

std::exception_ptr Work::exception() const { return operation_ ? operation_->error() : nullptr; }

void Work::wait() {
  if (!operation_) return;
  wait(operation_->engine_ ? operation_->engine_->options().timeout : kNoTimeout);
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!operation_) return;
  if (operation_->engine_) {
    operation_->engine_->wait(*operation_, timeout);
  } else if (auto error = operation_->error()) {
    std::rethrow_exception(error);
  }
}

bool Work::wait_on_device() {
  if (!operation_) return true;
  if (operation_->done()) {
    if (auto error = operation_->error()) std::rethrow_exception(error);
    return true;
  }
  return operation_->queue_device_wait();
}

std::uint64_t Work::sequence() const { return operation_ ? operation_->collective().sequence : 0; }

std::string Work::describe() const { return operation_ ? operation_->collective().describe() : "no collective"; }

}  // namespace troupe::collectives
