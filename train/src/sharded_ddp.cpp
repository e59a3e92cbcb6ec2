#include "troupe/train/sharded_ddp.hpp"

#include <algorithm>
#include <chrono>

#include "bucketed_backward.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::train {

namespace {
bool is_view_of(const Tensor& t, const Tensor& view) {
  return t.defined() && view.defined() && t.shares_storage_with(view) && t.offset() == view.offset();
}
}  // namespace

ShardedDataParallel::ShardedDataParallel(nn::Module& module, OSS& optimizer, collectives::Communicator& comm,
                                         ShardedDdpOptions options)
    : module_(module), oss_(optimizer), comm_(comm), options_(options) {
  TROUPE_CHECK(options_.bucket_bytes > 0, "ShardedDataParallel: bucket_bytes must be > 0");
  const auto named = module_.named_parameters();
  const auto& managed = oss_.named_parameters();
  TROUPE_CHECK(named.size() == managed.size(), "ShardedDataParallel: the module has ", named.size(),
               " parameters, the OSS manages ", managed.size(), "; build the OSS over module.named_parameters()");
  for (std::size_t i = 0; i < named.size(); ++i)
    TROUPE_CHECK(named[i].param == managed[i].param && named[i].name == managed[i].name,
                 "ShardedDataParallel: parameter ", i, " is '", named[i].name, "' in the module but '", managed[i].name,
                 "' in the OSS; build the OSS over module.named_parameters()");
  if (options_.broadcast_from_rank0) broadcast_state();
  build_buckets();
  module_.set_grad_ready_hook([this](const std::string& name, nn::Parameter& param) { on_grad_ready(name, param); });
}

ShardedDataParallel::~ShardedDataParallel() {
  module_.set_grad_ready_hook({});
  for (auto& bucket : buckets_) {
    try {
      bucket.work.wait();
    } catch (...) {  // the communicator reports the failure to its next user
    }
  }
}

void ShardedDataParallel::broadcast_state() {
  for (const auto& [name, param] : module_.named_parameters()) comm_.broadcast(collectives::Buffer(param->data), 0);
  for (const auto& [name, buffer] : module_.named_buffers()) {
    if (buffer->defined() && buffer->numel() > 0) comm_.broadcast(collectives::Buffer(*buffer), 0);
  }
}

// DDP's grouping (reverse named order, cut at bucket_bytes or a dtype/device change),
// then inside each bucket one block per rank holding the parameters that rank owns.
void ShardedDataParallel::build_buckets() {
  const auto named = module_.named_parameters();
  const int world = comm_.size(), me = comm_.rank();
  std::vector<std::vector<std::size_t>> groups;
  std::size_t bytes = 0;
  for (std::size_t k = named.size(); k-- > 0;) {
    const Tensor& data = named[k].param->data;
    const Tensor* previous = groups.empty() ? nullptr : &named[groups.back().front()].param->data;
    const bool fresh = previous == nullptr || (bytes > 0 && bytes + data.nbytes() > options_.bucket_bytes) ||
                       previous->dtype() != data.dtype() || previous->device() != data.device();
    if (fresh) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(k);
    bytes += data.nbytes();
  }
  for (const auto& group : groups) {
    Bucket bucket;
    const Tensor& first = named[group.front()].param->data;
    bucket.dtype = first.dtype();
    bucket.device = first.device();
    std::vector<std::int64_t> fill(static_cast<std::size_t>(world), 0);
    for (auto k : group) {
      const int owner = oss_.owner(named[k].name);
      Slot slot;
      slot.param = named[k].param;
      slot.name = named[k].name;
      slot.owned = owner == me;
      slot.offset = fill[static_cast<std::size_t>(owner)];  // within the block for now
      fill[static_cast<std::size_t>(owner)] += slot.param->data.numel();
      bucket.used += slot.param->data.numel();
      bucket.slots.push_back(std::move(slot));
    }
    bucket.block = std::max<std::int64_t>(1, *std::max_element(fill.begin(), fill.end()));
    Tensor shard = Tensor::zeros({bucket.block}, bucket.dtype, bucket.device);
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      Slot& slot = bucket.slots[s];
      const std::int64_t n = slot.param->data.numel();
      if (slot.owned) slot.shard = shard.slice(slot.offset, slot.offset + n).reshape(slot.param->data.shape());
      slot.offset += oss_.owner(slot.name) * bucket.block;
      where_[slot.param] = {buckets_.size(), s};
    }
    shards_.push_back(std::move(shard));
    buckets_.push_back(std::move(bucket));
  }
}

// Allocates the buckets a synchronising backward freed and points every grad into
// them. A grad that is already this rank's reduced shard stays there (`live`, to be
// added to); any other defined grad is a local gradient and is carried into the
// bucket, as DDP would.
void ShardedDataParallel::bind_gradients() {
  const int world = comm_.size();
  for (auto& bucket : buckets_) {
    const bool fresh = !bucket.flat.defined();
    if (fresh) bucket.flat = Tensor::zeros({bucket.block * world}, bucket.dtype, bucket.device);
    for (auto& slot : bucket.slots) {
      Tensor& grad = slot.param->grad;
      if (fresh) {
        slot.view = bucket.flat.slice(slot.offset, slot.offset + slot.param->data.numel())
                        .reshape(slot.param->data.shape());
        slot.live = slot.owned && is_view_of(grad, slot.shard);
        if (grad.defined() && !slot.live) slot.view.copy_(grad);
      } else if (!grad.defined()) {
        slot.view.zero_();
        slot.live = false;  // dropped inside a no_sync window: start over
      } else if (!is_view_of(grad, slot.view)) {
        slot.view.copy_(grad);
      }
      grad = slot.view;
      slot.ready = false;
    }
    bucket.pending = static_cast<int>(bucket.slots.size());
    bucket.launched = false;
  }
  next_launch_ = 0;
}

Tensor ShardedDataParallel::backward(const Tensor& grad_output) {
  TROUPE_CHECK(!in_backward_, "ShardedDataParallel::backward: called from inside a backward");
  const auto start = std::chrono::steady_clock::now();
  bind_gradients();
  return detail::bucketed_backward(module_, grad_output, in_backward_, sync_, buckets_, stats_,
                                   [this] { finish_sync(); }, start);
}

void ShardedDataParallel::on_grad_ready(const std::string& name, nn::Parameter& param) {
  if (!in_backward_ || !sync_) return;
  const auto it = where_.find(&param);
  TROUPE_CHECK(it != where_.end(), "ShardedDataParallel: gradient of '", name,
               "' reported ready, but it is not one of the wrapped module's parameters at construction");
  Bucket& bucket = buckets_[it->second.first];
  Slot& slot = bucket.slots[it->second.second];
  TROUPE_CHECK(!slot.ready, "ShardedDataParallel: gradient of '", name,
               "' reported ready twice in one backward (a parameter used twice is not supported)");
  TROUPE_CHECK(is_view_of(param.grad, slot.view), "ShardedDataParallel: the gradient of '", name,
               "' was replaced during backward instead of accumulated into");
  slot.ready = true;
  if (--bucket.pending == 0) launch_ready_buckets();
  for (std::size_t b = 0; b < next_launch_; ++b) buckets_[b].work.test();  // drive MPI progress
}

void ShardedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_launch_++];
    // In place: block r of the bucket becomes the average of every rank's block r.
    if (comm_.size() > 1)
      bucket.work = comm_.reduce_scatter_async(collectives::Buffer(bucket.flat), collectives::ReduceOp::avg);
    bucket.launched = true;
  }
}

// Launches what unused parameters held back, waits, then moves each owned gradient to
// its shard and frees the buckets.
void ShardedDataParallel::finish_sync() {
  for (auto& bucket : buckets_) bucket.pending = 0;
  launch_ready_buckets();
  for (auto& bucket : buckets_) bucket.work.wait();
  for (auto& bucket : buckets_) {
    for (auto& slot : bucket.slots) {
      if (slot.owned) {
        if (slot.live) tensor::add_(slot.shard, slot.view);
        else slot.shard.copy_(slot.view);
        slot.param->grad = slot.shard;
        slot.live = true;
      } else {
        slot.param->grad = Tensor();
      }
      slot.view = Tensor();
    }
    bucket.flat = Tensor();
  }
}

std::vector<std::vector<std::string>> ShardedDataParallel::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (const auto& slot : bucket.slots) out.back().push_back(slot.name);
  }
  return out;
}

std::size_t ShardedDataParallel::gradient_bytes() const {
  std::size_t total = 0;
  for (const auto& shard : shards_) total += shard.nbytes();
  for (const auto& bucket : buckets_)
    if (bucket.flat.defined()) total += bucket.flat.nbytes();
  return total;
}

std::int64_t ShardedDataParallel::padding_elements() const {
  std::int64_t total = 0;
  for (const auto& bucket : buckets_) total += bucket.block * comm_.size() - bucket.used;
  return total;
}

}  // namespace troupe::train
