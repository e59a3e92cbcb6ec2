#include "troupe/parallel/ddp.hpp"

#include <chrono>

#include "bucketed_backward.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

DistributedDataParallel::DistributedDataParallel(nn::Module& module, collectives::Communicator& comm,
                                                 DdpOptions options)
    : module_(module), comm_(comm), options_(options) {
  TROUPE_CHECK(options_.bucket_bytes > 0, "DistributedDataParallel: bucket_bytes must be > 0");
  if (options_.broadcast_from_rank0) broadcast_state();
  build_buckets();
  module_.set_grad_ready_hook([this](const std::string& name, nn::Parameter& param) { on_grad_ready(name, param); });
}

DistributedDataParallel::~DistributedDataParallel() {
  module_.set_grad_ready_hook({});
  for (auto& bucket : buckets_) {
    try {
      bucket.work.wait();
    } catch (...) {  // the communicator reports the failure to its next user
    }
  }
}

// Parameters and buffers, one blocking broadcast each, in named order: every rank
// built the same model, so the order (and each count) agrees everywhere.
void DistributedDataParallel::broadcast_state() {
  for (const auto& [name, param] : module_.named_parameters()) {
    TROUPE_CHECK(param->data.defined(), "DistributedDataParallel: parameter '", name, "' is undefined");
    comm_.broadcast(collectives::Buffer(param->data), 0);
  }
  for (const auto& [name, buffer] : module_.named_buffers()) {
    if (buffer->defined() && buffer->numel() > 0) comm_.broadcast(collectives::Buffer(*buffer), 0);
  }
}

// Reverse parameter order, a new bucket when the dtype or device changes or the
// next parameter would overflow the capacity.
void DistributedDataParallel::build_buckets() {
  auto named = module_.named_parameters();
  std::vector<std::vector<std::size_t>> groups;  // indices into `named`
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
    const Tensor& first = named[group.front()].param->data;
    std::int64_t total = 0;
    for (auto k : group) total += named[k].param->data.numel();
    Bucket bucket;
    bucket.flat = Tensor::zeros({total}, first.dtype(), first.device());
    std::int64_t offset = 0;
    for (auto k : group) {
      nn::Parameter* p = named[k].param;
      Slot slot;
      slot.param = p;
      slot.name = named[k].name;
      slot.offset = offset;
      slot.view = bucket.flat.slice(offset, offset + p->data.numel()).reshape(p->data.shape());
      // A gradient that already exists is carried over into the bucket.
      if (p->grad.defined()) slot.view.copy_(p->grad);
      p->grad = slot.view;
      offset += p->data.numel();
      where_[p] = {buckets_.size(), bucket.slots.size()};
      bucket.slots.push_back(std::move(slot));
    }
    buckets_.push_back(std::move(bucket));
  }
}

// Puts every grad back into its bucket view (see the header: something may have
// dropped or replaced it since the last backward).
void DistributedDataParallel::bind_gradients() {
  for (auto& bucket : buckets_) {
    for (auto& slot : bucket.slots) {
      Tensor& grad = slot.param->grad;
      if (!grad.defined()) {
        slot.view.zero_();
      } else if (!grad.shares_storage_with(slot.view) || grad.offset() != slot.view.offset()) {
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

Tensor DistributedDataParallel::backward(const Tensor& grad_output) {
  TROUPE_CHECK(!in_backward_, "DistributedDataParallel::backward: called from inside a backward");
  const auto start = std::chrono::steady_clock::now();
  bind_gradients();
  return detail::bucketed_backward(
      module_, grad_output, in_backward_, sync_, buckets_, stats_, [this] { finish_sync(); }, start);
}

void DistributedDataParallel::on_grad_ready(const std::string& name, nn::Parameter& param) {
  if (!in_backward_ || !sync_) return;
  const auto it = where_.find(&param);
  TROUPE_CHECK(it != where_.end(), "DistributedDataParallel: gradient of '", name,
               "' reported ready, but it is not one of the wrapped module's parameters at construction");
  Bucket& bucket = buckets_[it->second.first];
  Slot& slot = bucket.slots[it->second.second];
  TROUPE_CHECK(!slot.ready, "DistributedDataParallel: gradient of '", name,
               "' reported ready twice in one backward (a parameter used twice is not supported)");
  TROUPE_CHECK(param.grad.shares_storage_with(slot.view) && param.grad.offset() == slot.view.offset(),
               "DistributedDataParallel: the gradient of '", name,
               "' was replaced during backward instead of accumulated into");
  slot.ready = true;
  if (--bucket.pending == 0) launch_ready_buckets();
  // Drive the buckets already in flight from here too: Open MPI moves data only inside
  // MPI calls, and between two layers' backward is a free moment to make one.
  for (std::size_t b = 0; b < next_launch_; ++b) buckets_[b].work.test();
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_launch_++];
    bucket.work = comm_.allreduce_async(collectives::Buffer(bucket.flat), collectives::ReduceOp::avg);
    bucket.launched = true;
  }
}

// Buckets whose gradients never all became final (parameters unused in this forward)
// go now, in order; then everything is waited for -- by the GPU when the all-reduce
// runs on a CUDA stream (NCCL), so the host queues the optimizer step at once.
void DistributedDataParallel::finish_sync() {
  for (auto& bucket : buckets_) bucket.pending = 0;
  launch_ready_buckets();
  for (auto& bucket : buckets_)
    if (!bucket.work.wait_on_device()) bucket.work.wait();
}

void DistributedDataParallel::zero_grad() {
  for (auto& bucket : buckets_) bucket.flat.zero_();
  for (auto& bucket : buckets_)
    for (auto& slot : bucket.slots) slot.param->grad = slot.view;
}

void DistributedDataParallel::set_micro_step(std::int64_t step) {
  TROUPE_CHECK(step >= 0, "DistributedDataParallel::set_micro_step: step must be >= 0, got ", step);
  micro_step_ = step;
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (const auto& slot : bucket.slots) out.back().push_back(slot.name);
  }
  return out;
}

}  // namespace troupe::parallel
