#include "troupe/train/distributed_sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "troupe/error.hpp"

namespace troupe::train {

std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  // seed + epoch as in PyTorch, spread by an odd constant so that neighbouring
  // (seed, epoch) pairs do not share a stream.
  std::mt19937_64 rng(seed + static_cast<std::uint64_t>(epoch) * 0x9E3779B97F4A7C15ull);
  for (std::size_t i = order.size(); i > 1; --i) {
    // Unbiased draw in [0, i): rejection of the top remainder of the 64-bit range.
    const std::uint64_t bound = i, limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
    std::uint64_t r = rng();
    while (r >= limit) r = rng();
    std::swap(order[i - 1], order[static_cast<std::size_t>(r % bound)]);
  }
  return order;
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, SamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  TROUPE_CHECK(dataset_size >= 0, "DistributedSampler: dataset size must be >= 0, got ", dataset_size);
  TROUPE_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got ", num_replicas);
  TROUPE_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank, " is outside [0, ", num_replicas,
               ")");
  TROUPE_CHECK(options.global_batch == 0 || options.global_batch >= num_replicas,
               "DistributedSampler: a global batch of ", options.global_batch, " leaves some of the ", num_replicas,
               " ranks without a sample");
  TROUPE_CHECK(options.global_batch >= 0, "DistributedSampler: global_batch must be >= 0, got ", options.global_batch);
  build_indices();
}

std::int64_t DistributedSampler::samples_per_replica(std::int64_t count, std::int64_t replicas, bool drop_last) {
  return drop_last ? count / replicas : (count + replicas - 1) / replicas;
}

void DistributedSampler::build_indices() {
  std::vector<std::int64_t> order(static_cast<std::size_t>(dataset_size_));
  if (options_.shuffle)
    order = epoch_permutation(dataset_size_, options_.seed, epoch_);
  else
    std::iota(order.begin(), order.end(), std::int64_t{0});
  order.erase(order.begin(), order.begin() + start_);
  total_size_ =
      samples_per_replica(static_cast<std::int64_t>(order.size()), num_replicas_, options_.drop_last) * num_replicas_;
  const std::size_t total = static_cast<std::size_t>(total_size_);
  // Padding repeats the permutation from its start (several times over if the data
  // set is smaller than the number of replicas).
  for (std::size_t i = 0; order.size() < total && !order.empty(); ++i) order.push_back(order[i]);
  order.resize(total);
  indices_.clear();
  // Blocks of global_batch positions (one block without it), strided inside each.
  const std::size_t block = options_.global_batch > 0 ? static_cast<std::size_t>(options_.global_batch) : total;
  const auto replicas = static_cast<std::size_t>(num_replicas_);
  for (std::size_t begin = 0; begin < total; begin += block)
    for (std::size_t i = begin + static_cast<std::size_t>(rank_); i < std::min(total, begin + block); i += replicas)
      indices_.push_back(order[i]);
  num_samples_ = static_cast<std::int64_t>(indices_.size());
}

std::int64_t DistributedSampler::local_batch() const {
  TROUPE_CHECK(options_.global_batch > 0, "DistributedSampler::local_batch: no global_batch was given");
  return options_.global_batch / num_replicas_ + (rank_ < options_.global_batch % num_replicas_ ? 1 : 0);
}

double DistributedSampler::batch_weight(std::int64_t position, std::int64_t count) const {
  if (options_.global_batch == 0 || options_.global_batch % num_replicas_ == 0) return 1.0;
  // Every block before the epoch's last is whole, so the block is position / share.
  const std::int64_t block = position / local_batch();
  const std::int64_t size = std::min(options_.global_batch, total_size_ - block * options_.global_batch);
  return static_cast<double>(num_replicas_) * static_cast<double>(count) / static_cast<double>(size);
}

std::int64_t DistributedSampler::consumed(std::int64_t position) const {
  if (position >= num_samples_) return total_size_;
  if (options_.global_batch == 0) return position * num_replicas_;
  return position / local_batch() * options_.global_batch;
}

void DistributedSampler::set_epoch(std::int64_t epoch) {
  TROUPE_CHECK(epoch >= 0, "DistributedSampler::set_epoch: epoch must be >= 0, got ", epoch);
  epoch_ = epoch;
  start_ = 0;
  position_ = 0;
  build_indices();
}

std::vector<std::int64_t> DistributedSampler::remaining() const {
  return std::vector<std::int64_t>(indices_.begin() + std::min(position_, num_samples_), indices_.end());
}

void DistributedSampler::advance(std::int64_t count) {
  TROUPE_CHECK(count >= 0 && position_ + count <= num_samples_, "DistributedSampler::advance: ", count,
               " more indices from position ", position_, " passes the epoch's ", num_samples_);
  position_ += count;
}

std::vector<std::int64_t> DistributedSampler::take(std::int64_t count) {
  TROUPE_CHECK(count >= 0, "DistributedSampler::take: count must be >= 0, got ", count);
  const std::int64_t n = std::min(count, num_samples_ - position_);
  std::vector<std::int64_t> out(indices_.begin() + position_, indices_.begin() + position_ + n);
  position_ += n;
  return out;
}

nn::StateDict DistributedSampler::state_dict() const {
  nn::StateDict dict;
  auto i64 = [](std::int64_t v) {
    Tensor t = Tensor::empty({}, DType::i64);  // 0-dim, exact for all 64 bits (a double is not)
    *t.data<std::int64_t>() = v;
    return t;
  };
  dict.insert("seed", i64(static_cast<std::int64_t>(options_.seed)));  // the bits, read back the same way
  dict.insert("epoch", i64(epoch_));
  dict.insert("start", i64(start_));
  dict.insert("position", i64(position_));
  dict.insert("consumed", i64(consumed(position_)));
  dict.insert("global_batch", i64(options_.global_batch));
  dict.insert("dataset_size", i64(dataset_size_));
  dict.insert("num_replicas", i64(num_replicas_));
  dict.insert("drop_last", i64(options_.drop_last ? 1 : 0));
  dict.insert("shuffle", i64(options_.shuffle ? 1 : 0));
  return dict;
}

void DistributedSampler::load_state_dict(const nn::StateDict& dict) {
  auto get = [&](const char* key) { return dict.at(key).to_vector<std::int64_t>().at(0); };
  const std::int64_t size = get("dataset_size"), replicas = get("num_replicas");
  const bool drop_last = get("drop_last") != 0, shuffle = get("shuffle") != 0;
  const std::int64_t epoch = get("epoch"), position = get("position");
  const std::int64_t start = dict.contains("start") ? get("start") : 0;  // absent before re-splitting existed
  TROUPE_CHECK(size == dataset_size_ && drop_last == options_.drop_last && shuffle == options_.shuffle,
               "DistributedSampler::load_state_dict: the state is for ", size, " samples (drop_last ", drop_last,
               ", shuffle ", shuffle, "), this sampler has ", dataset_size_, " (drop_last ", options_.drop_last,
               ", shuffle ", options_.shuffle, ")");
  TROUPE_CHECK(replicas >= 1 && start >= 0 && start <= size, "DistributedSampler::load_state_dict: num_replicas ",
               replicas, " / start ", start, " out of range for ", size, " samples");
  const std::int64_t saved_total = samples_per_replica(size - start, replicas, drop_last) * replicas;
  const std::int64_t global_batch = dict.contains("global_batch") ? get("global_batch") : 0;
  // `consumed` is the same on every rank; a state from before it existed had equal
  // shares, so position * replicas (or the whole epoch at its end) says the same.
  const std::int64_t done = dict.contains("consumed")            ? get("consumed")
                            : position * replicas >= saved_total ? saved_total
                                                                 : position * replicas;
  TROUPE_CHECK(epoch >= 0 && position >= 0 && global_batch >= 0 && done >= 0 && done <= saved_total,
               "DistributedSampler::load_state_dict: epoch ", epoch, " / position ", position, " / consumed ", done,
               " out of range (", saved_total, " positions in the epoch)");
  options_.seed = static_cast<std::uint64_t>(get("seed"));
  epoch_ = epoch;
  // The same split goes on where it was: this rank's position for `done`. Another
  // one: the first `done` places of the epoch are done (all of them once it reaches
  // its padding), and the rest is split anew from there.
  const bool same_split = replicas == num_replicas_ && global_batch == options_.global_batch;
  start_ = same_split ? start : done == saved_total ? size : std::min(size, start + done);
  build_indices();
  if (!same_split || done == 0)
    position_ = 0;
  else if (done == total_size_)
    position_ = num_samples_;
  else if (options_.global_batch == 0)
    position_ = done / num_replicas_;
  else
    position_ = done / options_.global_batch * local_batch();
}

}  // namespace troupe::train
