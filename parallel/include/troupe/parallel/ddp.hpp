// DistributedDataParallel: the same model on every rank, gradients averaged across ranks
// (PyTorch's torch.nn.parallel.DistributedDataParallel, c10d's Reducer).
//
// At construction every parameter and buffer is broadcast from rank 0, so all ranks
// start identical whatever their seeds. Gradients live in flat buckets of about
// `bucket_bytes` (default 25 MB): each parameter's `grad` is a view into its bucket,
// so the all-reduce works on the gradients themselves, with no copy in or out.
// Buckets are filled in the reverse order of named_parameters() -- the order nn's
// grad-ready hook reports gradients final during backward -- and a bucket's async
// all-reduce (average) starts the moment its last gradient is final, while the
// earlier layers' backward still runs: communication overlaps computation.
//
// Buckets are launched strictly in bucket order (a bucket whose gradients are all
// final waits for the buckets before it), so every rank issues the same collectives
// in the same order even if hooks fired in a different order; buckets with a
// parameter that got no gradient (unused in this forward) are launched at the end
// of backward. backward() returns only when every bucket's all-reduce has finished:
// the optimizer may step right after it.
//
// Contract: every rank calls backward() the same number of times, with sync on or
// off alike (no_sync is a local decision that every rank must make together).
// Calls come from one thread. The wrapped module must outlive this object and must
// not be re-parameterised (Module::to) while it is wrapped.
//
// Gradient views: nn layers add into a defined grad and never replace it
// (parameter.hpp), so the views survive backward. Something that drops or replaces
// a grad -- zero_grad(set_to_none=true), an optimizer's zero_grad -- is repaired at
// the start of the next backward: an undefined grad becomes its zeroed bucket view,
// a foreign tensor is copied into the view, which then replaces it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/parallel/no_sync.hpp"
#include "troupe/trace.hpp"

namespace troupe::parallel {

class GradScaler;
class MasterWeights;

struct DdpOptions {
  // Bytes of gradients per bucket. Larger buckets mean fewer, more efficient
  // all-reduces but a later start for the first one; 25 MB is PyTorch's default.
  // A parameter larger than this gets a bucket of its own.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // Broadcast parameters and buffers from rank 0 at construction. Off only for a
  // caller that has already made every rank identical (a restored checkpoint).
  bool broadcast_from_rank0 = true;
};

// What the last synchronising backward() cost, for benchmarks and logs.
struct SyncStats {
  double backward_seconds = 0;               // the whole call, compute and communication
  double wait_seconds = 0;                   // spent waiting for all-reduces after compute ended
  int buckets = 0;                           // all-reduces launched
  int buckets_launched_during_backward = 0;  // of those, started before compute ended
};

// optimizer_step_with_gradient_accumulation's knobs.
struct AccumulationOptions {
  // Clip the global gradient norm to this before stepping; 0 disables clipping.
  double max_grad_norm = 0;
  // After a step, drop the grads (true, PyTorch's default) or zero-fill them. With
  // DDP both end the same way: the next backward starts from zeroed bucket views.
  bool set_to_none = true;
  // Loss scaling for mixed precision; null for none. Its inf/NaN verdict is
  // all-reduced, so every rank skips the same steps.
  GradScaler* scaler = nullptr;
  // f32 master weights of a bf16/f16 model (master_weights.hpp); null for none. The
  // optimizer must then be built on the masters: gradients are widened into them
  // before unscaling and clipping, and the stepped values rounded back into the model.
  MasterWeights* master = nullptr;
  // The tp communicator of a tensor-parallel model (tensor_parallel.hpp); null for none.
  // Clipping then sums the split parameters' squares over it.
  collectives::Communicator* tensor_parallel = nullptr;
  // The model runs sequence parallelism over tensor_parallel (tensor_parallel.hpp): its
  // whole parameters' gradients are summed over tp before clipping and the step.
  bool sequence_parallel = false;
  // Timeline spans of the backward and the optimizer step (troupe/trace.hpp); null: none.
  Tracer* tracer = nullptr;
};

struct AccumulationStep {
  bool stepped = false;   // the optimizer ran (false inside a window or on overflow)
  bool synced = false;    // this micro-step all-reduced the gradients
  bool skipped = false;   // a window ended but the scaler found inf/NaN
  double grad_norm = -1;  // before clipping, when max_grad_norm > 0
  int window = 0;         // micro-batches in the current window
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::Module& module, collectives::Communicator& comm, DdpOptions options = {});
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  // Removes the hook and waits for collectives still in flight. Never throws.
  ~DistributedDataParallel();

  nn::Module& module() { return module_; }
  collectives::Communicator& communicator() { return comm_; }
  const DdpOptions& options() const { return options_; }

  Tensor forward(const Tensor& input) { return module_.forward(input); }
  // The module's backward; with sync on, gradients come back averaged over ranks.
  Tensor backward(const Tensor& grad_output);

  // While the returned guard lives, backward() only accumulates gradients locally
  // (torch's `with ddp.no_sync():`); the first backward after it all-reduces the sum.
  [[nodiscard]] NoSync no_sync() { return NoSync(sync_); }
  bool sync_enabled() const { return sync_; }

  // Zero-fills every bucket (the gradients' views stay in place).
  void zero_grad();

  // One micro-batch of gradient accumulation, as one call (storch's API): runs
  // backward with `output_grad(scale)` -- the gradient that starts the model's
  // backward, e.g. `[&](double s) { return loss_fn.backward(s); }` -- where `scale`
  // is 1/window (times the loss scale with a scaler). Windows are `accum_steps`
  // micro-batches; the last one of an epoch is whatever is left of
  // `steps_per_epoch`, so it is scaled by its own size. Inside a window backward
  // runs under no_sync; the window's last micro-batch all-reduces, optionally clips,
  // steps the optimizer and clears the gradients. The position in the epoch is
  // counted here (micro_step()) and wraps after `steps_per_epoch`.
  AccumulationStep optimizer_step_with_gradient_accumulation(nn::Optimizer& optimizer,
                                                             const std::function<Tensor(double)>& output_grad,
                                                             int accum_steps, std::int64_t steps_per_epoch,
                                                             const AccumulationOptions& options = {});
  // Micro-batches done in the current epoch: part of the training state, so that a
  // resumed run continues inside the same accumulation window.
  std::int64_t micro_step() const { return micro_step_; }
  void set_micro_step(std::int64_t step);

  // The bucket layout: parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  const SyncStats& last_sync_stats() const { return stats_; }

 private:
  struct Slot {
    nn::Parameter* param = nullptr;
    std::string name;
    std::int64_t offset = 0;  // elements into the bucket
    Tensor view;              // the grad's home in the bucket
    bool ready = false;
  };
  struct Bucket {
    Tensor flat;
    std::vector<Slot> slots;
    int pending = 0;
    bool launched = false;
    collectives::Work work;
  };

  void broadcast_state();
  void build_buckets();
  void bind_gradients();
  void on_grad_ready(const std::string& name, nn::Parameter& param);
  void launch_ready_buckets();
  void finish_sync();

  nn::Module& module_;
  collectives::Communicator& comm_;
  DdpOptions options_;
  std::vector<Bucket> buckets_;  // in launch order: the last parameters first
  std::unordered_map<const nn::Parameter*, std::pair<std::size_t, std::size_t>> where_;  // bucket, slot
  std::size_t next_launch_ = 0;
  bool sync_ = true;
  bool in_backward_ = false;
  std::int64_t micro_step_ = 0;
  SyncStats stats_;
};

}  // namespace troupe::parallel
