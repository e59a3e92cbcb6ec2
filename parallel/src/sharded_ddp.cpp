#include "troupe/parallel/sharded_ddp.hpp"

#include <algorithm>
#include <chrono>

#include "bucketed_backward.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

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
// also cut where the owner changes, so each bucket has one owner.
void ShardedDataParallel::build_buckets() {
  const auto named = module_.named_parameters();
  std::size_t bytes = 0;
  for (std::size_t k = named.size(); k-- > 0;) {
    const Tensor& data = named[k].param->data;
    const int owner = oss_.owner(named[k].name);
    Bucket* last = buckets_.empty() ? nullptr : &buckets_.back();
    const bool fresh = last == nullptr || (bytes > 0 && bytes + data.nbytes() > options_.bucket_bytes) ||
                       last->owner != owner || last->dtype != data.dtype() || last->device != data.device();
    if (fresh) {
      Bucket bucket;
      bucket.dtype = data.dtype();
      bucket.device = data.device();
      bucket.owner = owner;
      buckets_.push_back(std::move(bucket));
      bytes = 0;
    }
    Bucket& bucket = buckets_.back();
    Slot slot;
    slot.param = named[k].param;
    slot.name = named[k].name;
    slot.offset = bucket.numel;
    bucket.numel += data.numel();
    where_[slot.param] = {buckets_.size() - 1, bucket.slots.size()};
    bucket.slots.push_back(std::move(slot));
    bytes += data.nbytes();
  }
}

namespace {
// The slot's place in a bucket-sized flat tensor, shaped as its parameter.
Tensor place_of(const Tensor& flat, std::int64_t offset, const Tensor& data) {
  return flat.slice(offset, offset + data.numel()).reshape(data.shape());
}
}  // namespace

// Before each backward: resets the per-backward flags; for a bucket with no buffer,
// notes which owned gradients are still the kept average (live: to be added to) and
// takes them out of the grads, so the backward cannot write into the average (a grad
// that is undefined gets a fresh home when its bucket is bound). A bucket whose buffer
// survived a no_sync backward keeps accumulating into it. Then binds the first bucket
// (sync), or every bucket (no_sync: the full local gradients are needed).
void ShardedDataParallel::prepare() {
  for (auto& bucket : buckets_) {
    bucket.pending = static_cast<int>(bucket.slots.size());
    bucket.launched = false;
    bucket.work = collectives::Work();
    bool any_live = false;
    for (auto& slot : bucket.slots) {
      slot.ready = false;
      Tensor& grad = slot.param->grad;
      if (bucket.flat.defined()) {  // bound in a no_sync backward
        if (!grad.defined()) {
          slot.view.zero_();
          slot.live = false;  // dropped inside the no_sync window: start over
        } else if (!is_view_of(grad, slot.view)) {
          slot.view.copy_(grad);
        }
        grad = slot.view;
        continue;
      }
      slot.live = bucket.kept.defined() && is_view_of(grad, place_of(bucket.kept, slot.offset, slot.param->data));
      if (slot.live) grad = Tensor();
      any_live = any_live || slot.live;
    }
    if (!bucket.flat.defined() && !any_live) bucket.kept = Tensor();  // nothing to add to: free it now
  }
  next_launch_ = next_harvest_ = 0;
  peak_bytes_ = gradient_bytes();
  if (!sync_) {
    for (std::size_t b = 0; b < buckets_.size(); ++b) bind(b);
  } else if (!buckets_.empty()) {
    bind(0);
  }
}

// Gives bucket b its buffer and points its grads into it. A grad that is defined is a
// local gradient (from before this backward, or computed ahead of its bucket) and is
// carried into the buffer, as DDP would. To bound the memory, first waits for every
// launched bucket's reduction but the last one's.
void ShardedDataParallel::bind(std::size_t b) {
  Bucket& bucket = buckets_[b];
  if (bucket.flat.defined()) return;
  while (next_harvest_ + 1 < next_launch_) harvest(next_harvest_++);
  bucket.flat = Tensor::zeros({bucket.numel}, bucket.dtype, bucket.device);
  for (auto& slot : bucket.slots) {
    slot.view = place_of(bucket.flat, slot.offset, slot.param->data);
    Tensor& grad = slot.param->grad;
    if (grad.defined()) slot.view.copy_(grad);
    grad = slot.view;
  }
  peak_bytes_ = std::max(peak_bytes_, gradient_bytes());
}

Tensor ShardedDataParallel::backward(const Tensor& grad_output) {
  TROUPE_CHECK(!in_backward_, "ShardedDataParallel::backward: called from inside a backward");
  const auto start = std::chrono::steady_clock::now();
  prepare();
  return detail::bucketed_backward(
      module_, grad_output, in_backward_, sync_, buckets_, stats_, [this] { finish_sync(); }, start);
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
  if (!bucket.flat.defined()) bind(it->second.first);  // finished ahead of its bucket's turn
  TROUPE_CHECK(is_view_of(param.grad, slot.view), "ShardedDataParallel: the gradient of '", name,
               "' was replaced during backward instead of accumulated into");
  slot.ready = true;
  if (--bucket.pending == 0) launch_ready_buckets();
  harvest_finished();  // drives the collectives in flight and frees what they are done with
}

void ShardedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    const std::size_t b = next_launch_;
    bind(b);  // a bucket of parameters the backward never reached has no buffer yet
    Bucket& bucket = buckets_[b];
    if (comm_.size() > 1) {
      const collectives::Buffer buffer(bucket.flat);
      bucket.work = options_.reduction == ShardedDdpOptions::Reduction::reduce
                        ? comm_.reduce_async(buffer, bucket.owner, collectives::ReduceOp::avg)
                        : comm_.allreduce_async(buffer, collectives::ReduceOp::avg);
    }
    bucket.launched = true;
    ++next_launch_;
    // The next bucket's gradients come next: give them their home before they are
    // computed, so that the layers write straight into it.
    if (next_launch_ < buckets_.size()) bind(next_launch_);
  }
}

void ShardedDataParallel::harvest_finished() {
  while (next_harvest_ < next_launch_ && buckets_[next_harvest_].work.test()) harvest(next_harvest_++);
}

// Bucket b's reduction is done (or is waited for here): the owner keeps the averages
// -- the buffer itself when no gradient is to be added to, else added into / copied
// over the kept ones -- and the other ranks drop the bucket and their grads.
void ShardedDataParallel::harvest(std::size_t b) {
  Bucket& bucket = buckets_[b];
  bucket.work.wait();
  if (bucket.owner == comm_.rank()) {
    bool any_live = false;
    for (const auto& slot : bucket.slots) any_live = any_live || slot.live;
    if (!any_live) {
      bucket.kept = bucket.flat;  // the grads are already views into it
    } else {
      for (auto& slot : bucket.slots) {
        Tensor home = place_of(bucket.kept, slot.offset, slot.param->data);
        if (slot.live)
          tensor::add_(home, slot.view);
        else
          home.copy_(slot.view);
        slot.param->grad = home;
      }
    }
  } else {
    for (auto& slot : bucket.slots) slot.param->grad = Tensor();
  }
  for (auto& slot : bucket.slots) slot.view = Tensor();
  bucket.flat = Tensor();
}

// Launches what unused parameters held back, then waits for every reduction.
void ShardedDataParallel::finish_sync() {
  for (auto& bucket : buckets_) bucket.pending = 0;
  launch_ready_buckets();
  while (next_harvest_ < buckets_.size()) harvest(next_harvest_++);
}

std::vector<std::vector<std::string>> ShardedDataParallel::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (const auto& slot : bucket.slots) out.back().push_back(slot.name);
  }
  return out;
}

std::vector<int> ShardedDataParallel::bucket_owners() const {
  std::vector<int> out;
  for (const auto& bucket : buckets_) out.push_back(bucket.owner);
  return out;
}

std::size_t ShardedDataParallel::gradient_bytes() const {
  std::size_t total = 0;
  for (const auto& bucket : buckets_) {
    if (bucket.flat.defined()) total += bucket.flat.nbytes();
    if (bucket.kept.defined()) total += bucket.kept.nbytes();
  }
  return total;
}

}  // namespace troupe::parallel
