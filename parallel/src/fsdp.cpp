// FSDP at run time: gather a unit before its first leaf, free it after its last,
// prefetch the next unit's gather, reduce-scatter each unit's gradient after its
// backward (one in flight at a time), and the optimizer-side helpers.
#include "troupe/parallel/fsdp.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "troupe/error.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/tensor/fused_optim.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
}  // namespace

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (nn::Module* module : hooked_) module->set_hooks(nullptr);
  wait_all();
}

void FullyShardedDataParallel::wait_all() noexcept {
  for (auto& unit : units_) {
    for (auto* works : {&unit.gathers, &unit.reduce_scatters})
      for (auto& work : *works) {
        try {
          work.wait();
        } catch (...) {  // the communicator reports the failure to its next user
        }
      }
  }
}

void FullyShardedDataParallel::note_bytes(std::ptrdiff_t delta) {
  gathered_bytes_ = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(gathered_bytes_) + delta);
  stats_.peak_gathered_bytes = std::max(stats_.peak_gathered_bytes, gathered_bytes_);
}

// Allocates the unit's full flat buffers and starts one all-gather per flat.
void FullyShardedDataParallel::launch_gather(std::size_t u, bool ahead) {
  Unit& unit = units_[u];
  for (auto& flat : unit.flats) {
    if (keeps_parameters() && flat.shard->data.shares_storage_with(flat.full)) {
      // shard_grad_op: the buffer stays and already holds this rank's block.
      unit.gathers.push_back(comm_.allgather_async(collectives::Buffer(flat.full)));
      continue;
    }
    if (!keeps_parameters()) {
      flat.full = Tensor::empty({flat.padded}, flat.dtype, flat.device);
      note_bytes(static_cast<std::ptrdiff_t>(flat.full.nbytes()));
    }
    if (!keeps_parameters() && !pool_ && flat.shard->data.dtype() == flat.dtype) {
      unit.gathers.push_back(
          comm_.allgather_async(collectives::Buffer(flat.shard->data), collectives::Buffer(flat.full)));
      continue;
    }
    // Offload or master shards: the shard goes (from the pool, rounded to the model's
    // dtype) into this rank's slice of the gathered buffer on the compute device, and
    // the all-gather runs in place.
    const auto start = Clock::now();
    const std::int64_t me = comm_.rank();
    flat.full.slice(me * flat.shard_numel, (me + 1) * flat.shard_numel).copy_(flat.shard->data);
    if (pool_) {
      stats_.offload_bytes_to_device += flat.shard->data.nbytes();
      stats_.offload_seconds += seconds_since(start);
    }
    unit.gathers.push_back(comm_.allgather_async(collectives::Buffer(flat.full)));
  }
  unit.state = UnitState::gathering;
  ++stats_.gathers;
  if (ahead) ++stats_.prefetched;
}

// Waits for unit u's gather (starting it if nobody prefetched it), points the module's
// parameters into the gathered buffer, then (with `prefetch`) starts the gather of the
// unit that follows u in `order`, so it travels while u computes.
void FullyShardedDataParallel::ensure_gathered(std::size_t u, const std::vector<std::size_t>& order, bool prefetch) {
  Unit& unit = units_[u];
  if (unit.state == UnitState::gathered) return;
  if (unit.state == UnitState::sharded) launch_gather(u, false);
  // On NCCL the compute stream waits for the gather, not the host (issue 25).
  for (auto& work : unit.gathers)
    if (!work.wait_on_device()) work.wait();
  unit.gathers.clear();
  for (auto& flat : unit.flats)
    for (auto& entry : flat.entries)
      entry.param->data = flat.full.slice(entry.offset, entry.offset + entry.numel).reshape(entry.shape);
  unit.state = UnitState::gathered;
  if (prefetch) prefetch_after(u, order);
}

// Starts the gather of the unit after u in `order`, unless it is gathered already.
void FullyShardedDataParallel::prefetch_after(std::size_t u, const std::vector<std::size_t>& order) {
  const auto at = std::find(order.begin(), order.end(), u);
  if (at != order.end() && at + 1 != order.end() && units_[*(at + 1)].state == UnitState::sharded)
    launch_gather(*(at + 1), true);
}

void FullyShardedDataParallel::release_parameters(std::size_t u) {
  Unit& unit = units_[u];
  if (keeps_parameters()) {
    // The buffers stay; one whose gather did not finish (an exception) is gathered anew.
    if (unit.state != UnitState::gathered) unit.state = UnitState::sharded;
    return;
  }
  for (auto& flat : unit.flats) {
    for (auto& entry : flat.entries) entry.param->data = Tensor();
    note_bytes(-static_cast<std::ptrdiff_t>(flat.full.nbytes()));
    flat.full = Tensor();
  }
  unit.state = UnitState::sharded;
}

// Each parameter's grad becomes a view into the unit's zeroed flat gradient (kept
// from a no_sync window, if there was one), so the leaves' backward adds into it.
void FullyShardedDataParallel::bind_gradients(std::size_t u) {
  for (auto& flat : units_[u].flats) {
    if (!flat.full_grad.defined()) {
      flat.full_grad = Tensor::zeros({flat.padded}, flat.dtype, flat.device);
      note_bytes(static_cast<std::ptrdiff_t>(flat.full_grad.nbytes()));
    }
    for (auto& entry : flat.entries) {
      Tensor view = flat.full_grad.slice(entry.offset, entry.offset + entry.numel).reshape(entry.shape);
      Tensor& grad = entry.param->grad;
      if (grad.defined() && !(grad.shares_storage_with(view) && grad.offset() == view.offset())) view.copy_(grad);
      grad = view;
    }
  }
}

// Reduce-scatters (avg) the unit's flat gradients; the module's grads are dropped at
// once, the buffer when the collective is finished.
void FullyShardedDataParallel::launch_reduce_scatter(std::size_t u) {
  if (pending_reduce_ != kNoUnit) finish_reduce_scatter(pending_reduce_);
  Unit& unit = units_[u];
  for (auto& flat : unit.flats) {
    for (auto& entry : flat.entries) entry.param->grad = Tensor();
    flat.reduced = Tensor::empty({flat.shard_numel}, flat.dtype, flat.device);
    unit.reduce_scatters.push_back(comm_.reduce_scatter_async(
        collectives::Buffer(flat.full_grad), collectives::Buffer(flat.reduced), collectives::ReduceOp::avg));
  }
  ++stats_.reduce_scatters;
  pending_reduce_ = u;
}

// DDP's rule for the shard: a defined gradient is added to, an undefined one is set.
void FullyShardedDataParallel::finish_reduce_scatter(std::size_t u) {
  Unit& unit = units_[u];
  // A device wait suffices even with offload: the copy to the host pool below is a
  // cudaMemcpy, which waits for the stream (and so for the reduce-scatter) itself.
  for (auto& work : unit.reduce_scatters)
    if (!work.wait_on_device()) work.wait();
  unit.reduce_scatters.clear();
  for (auto& flat : unit.flats) {
    Tensor& grad = flat.shard->grad;
    const Tensor& master = flat.shard->data;
    if (pool_ || master.dtype() != flat.dtype) {
      // Offload: the reduced block goes back to the pool, where the optimizer steps;
      // master shards: it is widened to the master dtype.
      const auto start = Clock::now();
      if (grad.defined()) {
        Tensor widened = Tensor::empty({flat.shard_numel}, master.dtype(), master.device());
        widened.copy_(flat.reduced);
        tensor::add_(grad, widened);
      } else {
        grad = pool_ ? pool_->empty({flat.shard_numel}, master.dtype())
                     : Tensor::empty({flat.shard_numel}, master.dtype(), master.device());
        grad.copy_(flat.reduced);
      }
      if (pool_) {
        stats_.offload_bytes_to_host += flat.reduced.nbytes();
        stats_.offload_seconds += seconds_since(start);
      }
    } else if (grad.defined()) {
      tensor::add_(grad, flat.reduced);
    } else {
      grad = flat.reduced;
    }
    flat.reduced = Tensor();
    note_bytes(-static_cast<std::ptrdiff_t>(flat.full_grad.nbytes()));
    flat.full_grad = Tensor();
  }
  if (pending_reduce_ == u) pending_reduce_ = kNoUnit;
}

// shard_grad_op: once the optimizer has stepped (or a state dict was loaded), every
// unit's gathered parameters lag its shards; they are gathered again, unit by unit as
// they are used (prefetched), in place.
void FullyShardedDataParallel::refresh_stale_parameters() {
  if (!keeps_parameters()) return;
  if (!parameters_stale_ && optimizer_->step_count() == gathered_at_step_) return;
  for (auto& unit : units_) unit.state = UnitState::sharded;
  gathered_at_step_ = optimizer_->step_count();
  parameters_stale_ = false;
}

// A unit's gradients are complete: its parameters go, its gradient is reduce-scattered.
void FullyShardedDataParallel::after_unit_backward(std::size_t u, bool post) {
  release_parameters(u);
  if (options_.prefetch && post) {
    // The previous unit's gradient goes before the next unit's parameters come.
    if (pending_reduce_ != kNoUnit) finish_reduce_scatter(pending_reduce_);
    prefetch_after(u, backward_order_);
  }
  if (sync_) launch_reduce_scatter(u);
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  TROUPE_CHECK(!busy_, "FullyShardedDataParallel::forward: called from inside a forward or backward");
  refresh_stale_parameters();
  busy_ = true;
  stats_ = FsdpStats{};
  stats_.peak_gathered_bytes = gathered_bytes_;
  Tensor x = input;
  try {
    if (!hooked_.empty()) {
      if (root_unit_ != kNoUnit) ensure_gathered(root_unit_, forward_order_, options_.prefetch);
      x = module_.forward(x);  // the units' hooks gather and release them
      if (root_unit_ != kNoUnit) release_parameters(root_unit_);
    }
    for (std::size_t l = 0; l < leaves_.size(); ++l) {
      const std::size_t u = leaves_[l].unit;
      if (u != kNoUnit) ensure_gathered(u, forward_order_, options_.prefetch);
      x = leaves_[l].module->forward(x);
      if (u != kNoUnit && last_leaf_[u] == l) release_parameters(u);
    }
  } catch (...) {
    wait_all();
    for (std::size_t u = 0; u < units_.size(); ++u) {
      units_[u].gathers.clear();
      if (units_[u].state != UnitState::sharded) release_parameters(u);
    }
    busy_ = false;
    throw;
  }
  busy_ = false;
  return x;
}

Tensor FullyShardedDataParallel::backward(const Tensor& grad_output) {
  TROUPE_CHECK(!busy_, "FullyShardedDataParallel::backward: called from inside a forward or backward");
  refresh_stale_parameters();
  busy_ = true;
  Tensor g = grad_output;
  const bool post = options_.backward_prefetch == FsdpOptions::BackwardPrefetch::backward_post;
  try {
    if (!hooked_.empty()) {
      if (root_unit_ != kNoUnit) {
        ensure_gathered(root_unit_, backward_order_, options_.prefetch && !post);
        bind_gradients(root_unit_);
      }
      g = module_.backward(g);
      if (root_unit_ != kNoUnit) after_unit_backward(root_unit_, false);
    }
    for (std::size_t l = leaves_.size(); l-- > 0;) {
      const std::size_t u = leaves_[l].unit;
      if (u != kNoUnit && last_leaf_[u] == l) {  // the unit's first leaf in backward
        ensure_gathered(u, backward_order_, options_.prefetch && !post);
        bind_gradients(u);
      }
      g = leaves_[l].module->backward(g);
      if (u != kNoUnit && first_leaf_[u] == l) after_unit_backward(u, post);
    }
    if (pending_reduce_ != kNoUnit) finish_reduce_scatter(pending_reduce_);
  } catch (...) {
    // A failed backward drops the full local gradients (and any no_sync accumulation);
    // shard gradients keep whatever reduce-scatters completed: zero_grad before retrying.
    wait_all();
    for (std::size_t u = 0; u < units_.size(); ++u) {
      units_[u].gathers.clear();
      units_[u].reduce_scatters.clear();
      if (units_[u].state != UnitState::sharded) release_parameters(u);
      for (auto& flat : units_[u].flats) {
        for (auto& entry : flat.entries) entry.param->grad = Tensor();
        if (flat.full_grad.defined()) note_bytes(-static_cast<std::ptrdiff_t>(flat.full_grad.nbytes()));
        flat.full_grad = Tensor();
        flat.reduced = Tensor();
      }
    }
    pending_reduce_ = kNoUnit;
    busy_ = false;
    throw;
  }
  busy_ = false;
  return g;
}

bool FullyShardedDataParallel::step(GradScaler& scaler) { return scaler.step(*optimizer_); }

void FullyShardedDataParallel::zero_grad(bool set_to_none) {
  optimizer_->zero_grad(set_to_none);
  for (auto& unit : units_)
    for (auto& flat : unit.flats) {
      if (!flat.full_grad.defined()) continue;
      if (set_to_none) {
        for (auto& entry : flat.entries) entry.param->grad = Tensor();
        note_bytes(-static_cast<std::ptrdiff_t>(flat.full_grad.nbytes()));
        flat.full_grad = Tensor();
      } else {
        flat.full_grad.zero_();
      }
    }
}

double FullyShardedDataParallel::clip_grad_norm(double max_norm) { return clip(max_norm, nullptr, {}); }

double FullyShardedDataParallel::clip_grad_norm(double max_norm, collectives::Communicator& tp,
                                                const std::function<bool(const std::string& name)>& split) {
  return clip(max_norm, &tp, split);
}

double FullyShardedDataParallel::clip(double max_norm, collectives::Communicator* tp,
                                      const std::function<bool(const std::string&)>& split) {
  TROUPE_CHECK(max_norm >= 0, "FullyShardedDataParallel::clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  if (tp != nullptr) {
    // Each entry's part of this rank's shard counts as split or whole; padding is zero.
    double sums[2] = {0, 0};  // split, whole
    for (auto& unit : units_)
      for (auto& flat : unit.flats) {
        const Tensor& g = flat.shard->grad;
        if (!g.defined()) continue;
        TROUPE_CHECK(g.device().is_cpu(), "FullyShardedDataParallel::clip_grad_norm: tensor parallelism runs on ",
                     "host tensors, got a gradient on ", g.device());
        const std::int64_t begin = comm_.rank() * flat.shard_numel;
        tensor::dispatch_floating(g.dtype(), "FullyShardedDataParallel::clip_grad_norm", [&](auto tag) {
          using T = decltype(tag);
          const T* p = g.data<T>();
          for (const Entry& entry : flat.entries) {
            const std::int64_t lo = std::max(entry.offset, begin) - begin;
            const std::int64_t hi = std::min(entry.offset + entry.numel, begin + flat.shard_numel) - begin;
            double& sum = sums[split(entry.name) ? 0 : 1];
            for (std::int64_t i = lo; i < hi; ++i) sum += static_cast<double>(p[i]) * static_cast<double>(p[i]);
          }
        });
      }
    if (comm_.size() > 1) comm_.allreduce(collectives::Buffer(sums, 2), collectives::ReduceOp::sum);
    tp->allreduce(collectives::Buffer(sums, 1), collectives::ReduceOp::sum);
    return scale_gradients(max_norm, std::sqrt(sums[0] + sums[1]));
  }
  double sum_squares = 0;
  // f32 shards on a GPU are summed there, with one read-back for all: copying every
  // shard's gradient to the host each step moved the whole model's gradients.
  std::vector<const Tensor*> on_gpu;
  for (auto& unit : units_)
    for (auto& flat : unit.flats) {
      const Tensor& g = flat.shard->grad;
      if (!g.defined()) continue;
      if (g.device().is_cuda() && g.dtype() == tensor::DType::f32) {
        on_gpu.push_back(&g);
        continue;
      }
      const Tensor host = g.device().is_cpu() ? g : g.to(tensor::Device::cpu());
      tensor::dispatch_floating(host.dtype(), "FullyShardedDataParallel::clip_grad_norm", [&](auto tag) {
        using T = decltype(tag);
        const T* p = host.data<T>();
        for (std::int64_t i = 0; i < host.numel(); ++i)
          sum_squares += static_cast<double>(p[i]) * static_cast<double>(p[i]);
      });
    }
  if (!on_gpu.empty()) sum_squares += tensor::fused_sum_of_squares(on_gpu);
  if (comm_.size() > 1) comm_.allreduce(collectives::Buffer(&sum_squares, 1), collectives::ReduceOp::sum);
  return scale_gradients(max_norm, std::sqrt(sum_squares));
}

double FullyShardedDataParallel::scale_gradients(double max_norm, double total) {
  const double factor = max_norm / (total + 1e-6);  // torch's 1e-6, as nn::clip_grad_norm
  if (std::isfinite(total) && factor < 1.0)
    for (auto& unit : units_)
      for (auto& flat : unit.flats)
        if (flat.shard->grad.defined()) tensor::scale_(flat.shard->grad, factor);
  return total;
}

std::size_t FullyShardedDataParallel::unit_index(const std::string& path) const {
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (units_[u].path == path) return u;
  TROUPE_THROW(InvalidArgument, "FullyShardedDataParallel: no unit at '", path, "'");
}

std::vector<std::string> FullyShardedDataParallel::unit_paths() const {
  std::vector<std::string> out;
  for (const auto& unit : units_) out.push_back(unit.path);
  return out;
}

std::vector<std::string> FullyShardedDataParallel::unit_parameter_names(const std::string& path) const {
  std::vector<std::string> out;
  for (const auto& flat : units_[unit_index(path)].flats)
    for (const auto& entry : flat.entries) out.push_back(entry.name);
  return out;
}

std::int64_t FullyShardedDataParallel::unit_numel(const std::string& path) const {
  std::int64_t n = 0;
  for (const auto& flat : units_[unit_index(path)].flats) n += flat.numel;
  return n;
}

std::int64_t FullyShardedDataParallel::unit_padded_numel(const std::string& path) const {
  std::int64_t n = 0;
  for (const auto& flat : units_[unit_index(path)].flats) n += flat.padded;
  return n;
}

std::size_t FullyShardedDataParallel::shard_parameter_bytes() const {
  std::size_t n = 0;
  for (const auto& unit : units_)
    for (const auto& flat : unit.flats) n += flat.shard->data.nbytes();
  return n;
}

std::size_t FullyShardedDataParallel::parameter_bytes() const {
  std::size_t n = 0;
  for (const auto& unit : units_)
    for (const auto& flat : unit.flats) {
      if (keeps_parameters()) n += flat.full.nbytes();
      if (!flat.shard->data.shares_storage_with(flat.full)) n += flat.shard->data.nbytes();
    }
  return n;
}

std::size_t FullyShardedDataParallel::shard_gradient_bytes() const {
  std::size_t n = 0;
  for (const auto& unit : units_)
    for (const auto& flat : unit.flats)
      if (flat.shard->grad.defined()) n += flat.shard->grad.nbytes();
  return n;
}

std::size_t FullyShardedDataParallel::local_full_gradient_bytes() const {
  std::size_t n = 0;
  for (const auto& unit : units_)
    for (const auto& flat : unit.flats)
      if (flat.full_grad.defined()) n += flat.full_grad.nbytes();
  return n;
}

std::size_t FullyShardedDataParallel::optimizer_state_bytes() const {
  std::size_t n = 0;
  for (const auto& [key, value] : optimizer_->state_dict())
    if (key.find('/') != std::string::npos) n += value.nbytes();
  return n;
}

}  // namespace troupe::parallel
