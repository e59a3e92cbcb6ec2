// DataLoader: batches of a data set in a DistributedSampler's order, collated by a
// background thread while the model trains on the previous batch
// (torch.utils.data.DataLoader with one worker and prefetching).
//
//   DataLoader<TensorBatch> loader(sampler, 32, [&](const auto& idx) { return data.rows(idx); });
//   sampler.set_epoch(e); loader.reset();
//   while (auto batch = loader.next()) { ... }
//
// The prefetch thread reads the sampler's remaining indices when an epoch starts and
// collates up to `prefetch` batches ahead. The sampler's position moves only when
// next() hands a batch over, so the sampler's state always says what the training
// loop has consumed -- prefetched batches are not lost by a checkpoint. After
// set_epoch() or load_state_dict() on the sampler, call reset() (next() also notices
// an epoch change on its own).
//
// An exception thrown by `collate` on the prefetch thread is rethrown by next(). The
// loader must not outlive the sampler; next() is for one thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/train/distributed_sampler.hpp"

namespace troupe::train {

template <class Batch>
class DataLoader {
 public:
  using Collate = std::function<Batch(const std::vector<std::int64_t>& indices)>;

  // `drop_last`: leave out the rank's final batch when it is shorter than batch_size.
  DataLoader(DistributedSampler& sampler, std::int64_t batch_size, Collate collate, int prefetch = 2,
             bool drop_last = false)
      : sampler_(sampler),
        batch_size_(batch_size),
        collate_(std::move(collate)),
        prefetch_(prefetch),
        drop_last_(drop_last) {
    TROUPE_CHECK(batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", batch_size);
    TROUPE_CHECK(prefetch >= 1, "DataLoader: prefetch must be >= 1, got ", prefetch);
    TROUPE_CHECK(collate_ != nullptr, "DataLoader: collate function is empty");
  }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  ~DataLoader() { stop(); }

  std::int64_t batch_size() const { return batch_size_; }
  // Batches per epoch on this rank.
  std::int64_t batches_per_epoch() const {
    const std::int64_t n = sampler_.num_samples();
    return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  }

  // The next batch and its size, consumed from the sampler; nullopt at the end of the epoch.
  std::optional<Batch> next() {
    if (!running_ || epoch_ != sampler_.epoch() || consumed_ != sampler_.position()) reset();
    std::unique_lock lock(mutex_);
    ready_cv_.wait(lock, [&] { return !queue_.empty() || done_ || error_; });
    if (!queue_.empty()) {
      auto [batch, count] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      space_cv_.notify_one();
      sampler_.advance(count);
      consumed_ = sampler_.position();
      return std::move(batch);
    }
    if (error_) {
      auto error = std::exchange(error_, nullptr);
      lock.unlock();
      stop();
      std::rethrow_exception(error);
    }
    return std::nullopt;
  }

  // Drops prefetched batches and starts again from the sampler's current position.
  void reset() {
    stop();
    epoch_ = sampler_.epoch();
    consumed_ = sampler_.position();
    std::vector<std::int64_t> remaining = sampler_.remaining();
    done_ = false;
    stopping_ = false;
    running_ = true;
    thread_ = std::thread([this, remaining = std::move(remaining)] { produce(remaining); });
  }

 private:
  void produce(const std::vector<std::int64_t>& indices) {
    try {
      for (std::size_t begin = 0; begin < indices.size(); begin += static_cast<std::size_t>(batch_size_)) {
        const std::size_t end = std::min(indices.size(), begin + static_cast<std::size_t>(batch_size_));
        if (drop_last_ && end - begin < static_cast<std::size_t>(batch_size_)) break;
        {
          std::unique_lock lock(mutex_);
          space_cv_.wait(lock, [&] { return stopping_ || queue_.size() < static_cast<std::size_t>(prefetch_); });
          if (stopping_) return;
        }
        Batch batch = collate_(std::vector<std::int64_t>(indices.begin() + static_cast<std::ptrdiff_t>(begin),
                                                         indices.begin() + static_cast<std::ptrdiff_t>(end)));
        {
          std::lock_guard lock(mutex_);
          queue_.emplace_back(std::move(batch), static_cast<std::int64_t>(end - begin));
        }
        ready_cv_.notify_one();
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    ready_cv_.notify_one();
  }

  void stop() {
    if (!running_) return;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    space_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    queue_.clear();
    error_ = nullptr;
    running_ = false;
  }

  DistributedSampler& sampler_;
  std::int64_t batch_size_;
  Collate collate_;
  int prefetch_;
  bool drop_last_;

  std::thread thread_;
  bool running_ = false;
  std::int64_t epoch_ = -1;
  std::int64_t consumed_ = -1;  // the sampler position the queue continues from
  std::mutex mutex_;
  std::condition_variable ready_cv_, space_cv_;
  std::deque<std::pair<Batch, std::int64_t>> queue_;
  bool done_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace troupe::train
