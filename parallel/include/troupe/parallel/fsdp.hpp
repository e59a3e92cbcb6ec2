// FullyShardedDataParallel: ZeRO stage 3 (PyTorch's FSDP, fairscale's FSDP) --
// parameters, gradients and optimizer state all sharded; each rank keeps 1/W of the
// model between uses.
//
//   FullyShardedDataParallel fsdp(model, comm, adamw_factory,
//                                 {.auto_wrap_policy = module_type_auto_wrap_policy<nn::Linear>()});
//   loss.forward(fsdp.forward(x), y); fsdp.backward(loss.backward()); fsdp.step(); fsdp.zero_grad();
//
// How it works -- units and flat shards, forward and backward (Sequential leaves or
// module hooks), prefetch, the optimizer on the shards, accumulation, memory, sharded
// construction, shard_grad_op, full state dicts, mixed precision, CPU offload -- is told
// once, in docs/FSDP.md. The methods below say what each does; this is the contract:
//
// Every method that communicates (construction, forward, backward,
// clip_grad_norm, step(GradScaler&), the state-dict methods) is a collective: every
// rank calls it together, in the same order, from one thread. The module and the
// communicator outlive this object. Between uses, Module::state_dict() and the
// module's parameters are not meaningful: use full_state_dict().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"
#include "troupe/parallel/no_sync.hpp"
#include "troupe/parallel/offload_memory.hpp"
#include "troupe/parallel/oss.hpp"

namespace troupe::parallel {

class GradScaler;
class StateSliceSource;

// Decides whether `module` (at `path`, e.g. "3" or "1.0") becomes a unit. Called
// bottom-up on every module but the root, children before parents, with the number
// of its parameters that no unit inside it has taken yet.
using AutoWrapPolicy =
    std::function<bool(nn::Module& module, const std::string& path, std::int64_t unwrapped_parameters)>;

// torch's size_based_auto_wrap_policy: wraps a module once at least
// `min_num_params` of its parameters are not in a unit yet.
AutoWrapPolicy size_based_auto_wrap_policy(std::int64_t min_num_params);

// torch's ModuleWrapPolicy / transformer_auto_wrap_policy: wraps every module of one of
// the given types (e.g. <nn::Linear>).
template <class... Types>
AutoWrapPolicy module_type_auto_wrap_policy() {
  return [](nn::Module& module, const std::string&, std::int64_t) {
    return ((dynamic_cast<const Types*>(&module) != nullptr) || ...);
  };
}

struct FsdpOptions {
  // Picks units automatically; empty: none. A policy that picks no module at all is
  // an InvalidArgument (a typo'd type or too large a size would otherwise silently
  // give one unit holding the whole model, i.e. no parameter sharding benefit).
  AutoWrapPolicy auto_wrap_policy{};
  // Manual (nested) wrapping: module paths to make units, e.g. {"1", "1.0", "3"}.
  std::vector<std::string> wrap{};
  // What is sharded (PyTorch's ShardingStrategy, DeepSpeed's ZeRO stages):
  //   full_shard:     parameters, gradients and optimizer state (ZeRO-3): between uses
  //                   a rank holds only its shards, 16N/W bytes with Adam in f32.
  //   shard_grad_op:  gradients and optimizer state only (ZeRO-2): every rank keeps the
  //                   full parameters in the gathered flat buffers all the time (its
  //                   shard is a view into its own block of them, unless master_dtype
  //                   or cpu_offload keeps it apart), so forward and backward gather
  //                   nothing; gradients are reduce-scattered per unit as in full_shard,
  //                   the optimizer steps the shard, and the next forward all-gathers
  //                   the updated blocks in place, unit by unit, prefetched. 4N + 12N/W
  //                   bytes with Adam in f32, split element by element, so one tensor
  //                   larger than 1/W of the model does not unbalance it. PyTorch's
  //                   SHARD_GRAD_OP frees the full parameters after backward; this keeps
  //                   them, as DeepSpeed's stage 2 and fairscale's ShardedDDP do.
  enum class ShardingStrategy { full_shard, shard_grad_op };
  ShardingStrategy sharding_strategy = ShardingStrategy::full_shard;
  // Start the next unit's all-gather while the current one computes.
  bool prefetch = true;
  // When backward starts the next unit's all-gather (with `prefetch` on); the names
  // are PyTorch's BackwardPrefetch values:
  //   backward_post: once the current unit's gradients are computed and the previous
  //                  unit's reduce-scatter is finished. At the peak a rank holds its
  //                  shards, the current unit's parameters and gradient, and one more
  //                  unit's gradient (still being reduce-scattered): 16N/W plus about
  //                  one unit and its gradient bucket. Each backward gather travels while
  //                  the gradient before it is reduce-scattered, not while anything
  //                  computes. troupe's default, unlike PyTorch's: memory is what FSDP is
  //                  for, and on the CPU the collectives copy on the same cores that
  //                  compute, so the overlap `backward_pre` buys is small (the sharding
  //                  bench could not tell the two apart in speed on 2 cores).
  //   backward_pre:  as soon as the current unit is gathered, so the gather travels
  //                  while the current unit computes its gradients (PyTorch's default).
  //                  The peak adds the next unit's parameters: four units in flight.
  enum class BackwardPrefetch { backward_post, backward_pre };
  BackwardPrefetch backward_prefetch = BackwardPrefetch::backward_post;
  // Broadcast rank 0's parameters and buffers at construction, as DDP does.
  bool broadcast_from_rank0 = true;
  // CPU offload: the parameter shards, their gradients and the optimizer state live in
  // a OffloadMemory (offload_memory.hpp) and the optimizer steps there; a unit's shard is copied
  // to the compute device just before its all-gather and the reduced gradient block
  // copied back after the reduce-scatter. For a model on the CPU the compute device is
  // host memory too, so the copies are host-to-host, but they are made and measured
  // (FsdpStats::offload_*): the pool is separate memory (mmap'ed, mlock'ed if allowed).
  bool cpu_offload = false;
  // Mixed precision: the dtype of the shards (the masters the optimizer steps), e.g.
  // f32 for a model that was converted to bf16/f16 before wrapping. Gathers round the
  // masters into the model's dtype (so forward/backward and the gathered bytes are
  // low-precision) and the reduced low-precision gradients are widened into the shard
  // gradients, where GradScaler and clipping see them. Unset: the model's own dtype.
  std::optional<tensor::DType> master_dtype{};
  // Sharded construction (PyTorch's meta-device init + FSDP's device_id): a module
  // built on Device::meta() holds descriptions, not values; each rank materialises on
  // `device` only the elements of its own shards (full_shard) or its units' flat
  // buffers (shard_grad_op), computed from the same Philox streams as a CPU build, so
  // the result equals building the whole model and broadcasting it, bit for bit, and
  // nothing is broadcast. A module with real tensors ignores it.
  tensor::Device device = tensor::Device::cpu();
};

// Counters over the last forward + backward (reset by forward()).
struct FsdpStats {
  int gathers = 0;     // all-gathers of a unit
  int prefetched = 0;  // ... of which were started ahead, before the unit was needed
  int reduce_scatters = 0;
  std::size_t peak_gathered_bytes = 0;  // max of (gathered parameters + full gradients) at once
  // CPU offload only: bytes copied from the pool to the compute device (shards before
  // their gathers) and back (reduced gradient blocks), and the seconds those copies took.
  std::size_t offload_bytes_to_device = 0;
  std::size_t offload_bytes_to_host = 0;
  double offload_seconds = 0;
};

class FullyShardedDataParallel {
 public:
  FullyShardedDataParallel(nn::Module& module, collectives::Communicator& comm, const OptimizerFactory& factory,
                           FsdpOptions options = {});
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;
  // Waits for collectives still in flight. Never throws.
  ~FullyShardedDataParallel();

  nn::Module& module() { return module_; }
  Tensor forward(const Tensor& input);
  // With sync on, returns with this rank's shard gradients holding the average over
  // ranks (added to what they held, as DDP); under no_sync, accumulates locally.
  Tensor backward(const Tensor& grad_output);

  // The optimizer over this rank's shards (for LR schedules, GradScaler::unscale_).
  nn::Optimizer& optimizer() { return *optimizer_; }
  void step() { optimizer_->step(); }
  // Unscales and checks this rank's shard gradients; the scaler all-reduces the
  // verdict, so an inf/NaN in any rank's shard skips the step on every rank.
  bool step(GradScaler& scaler);
  // Shard gradients, and the full local ones a no_sync window keeps.
  void zero_grad(bool set_to_none = true);
  // The true global norm (squares of every rank's shard summed with one all-reduce;
  // padding is zero), then every shard gradient scaled; returns the norm before.
  double clip_grad_norm(double max_norm);
  // The same for a module split over `tp` (tensor_parallel.hpp; this FSDP shards its
  // part over the data-parallel ranks): the squares of the parameters `split` names are
  // summed over tp as well, the others' (equal on every tp rank) counted once. Host
  // gradients only. A collective over the ranks of both.
  double clip_grad_norm(double max_norm, collectives::Communicator& tp,
                        const std::function<bool(const std::string& name)>& split);

  [[nodiscard]] NoSync no_sync() { return NoSync(sync_); }
  bool sync_enabled() const { return sync_; }

  // Unit paths in unit order ("" is the root unit), and their parameter names.
  std::vector<std::string> unit_paths() const;
  std::vector<std::string> unit_parameter_names(const std::string& path) const;
  // Elements of a unit's flat buffers before and after padding to a multiple of W.
  std::int64_t unit_numel(const std::string& path) const;
  std::int64_t unit_padded_numel(const std::string& path) const;

  // Bytes this rank holds between steps: its parameter shards, its shard gradients
  // (when defined), the optimizer's per-parameter state; plus, inside a no_sync
  // window, the full gradients kept locally.
  std::size_t shard_parameter_bytes() const;
  // Bytes of parameters this rank holds between steps: its shards (full_shard), or
  // the full, padded parameters (shard_grad_op, plus any shard kept apart from them).
  std::size_t parameter_bytes() const;
  std::size_t shard_gradient_bytes() const;
  std::size_t optimizer_state_bytes() const;
  std::size_t local_full_gradient_bytes() const;
  const FsdpStats& stats() const { return stats_; }
  // The offload pool (null without cpu_offload).
  const OffloadMemory* offload_memory() const { return pool_.get(); }

  // The unwrapped model's state dict (same keys, order, shapes, dtypes), on every rank.
  nn::StateDict full_state_dict();
  // The same entries one at a time: each parameter is gathered (one broadcast per rank
  // holding part of it), handed to `fn`, and dropped unless `fn` keeps it.
  void for_each_full_tensor(const std::function<void(const std::string& name, const Tensor& value)>& fn);
  // Takes a full state dict (from any mode, any world size): each rank keeps its
  // slices. Strict, checked before anything changes; when any rank rejects the dict,
  // every rank throws InvalidArgument.
  void load_full_state_dict(const nn::StateDict& dict);
  // What the base optimizer would return had it been built over the unwrapped model's
  // named_parameters(): lr, step, hyper-parameters, then "<param>/<slot>" in named
  // order (slots of parameters never stepped are absent). On every rank.
  nn::StateDict full_optimizer_state_dict();
  void load_full_optimizer_state_dict(const nn::StateDict& dict);

  // This rank's piece of each full tensor, with no communication and no copy (a copy
  // only to round master shards into the model's dtype): elements [begin, begin +
  // data.numel()) of the flattened full tensor (data undefined: this rank holds none).
  // Over every rank the pieces tile each tensor exactly, so they are the slices of a
  // parallel full-state-dict save (checkpoint::ParallelCheckpoint: checkpoint::Slice
  // is {begin, data}), where no rank holds more than its shard. Buffers and 0-dim
  // values are rank 0's.
  struct LocalSlice {
    std::string name;     // the full_state_dict() / full_optimizer_state_dict() key
    tensor::DType dtype;  // of the full tensor
    tensor::Shape shape;  // of the full tensor
    std::int64_t begin = 0;
    Tensor data;
  };
  // full_state_dict()'s entries, in its order.
  std::vector<LocalSlice> local_model_slices();
  // full_optimizer_state_dict()'s "<param>/<slot>" entries, in its order (the
  // hyper-parameters and step count are optimizer().state_dict()'s, the same on every
  // rank).
  std::vector<LocalSlice> local_optimizer_slices();
  // The sharded resume, the inverse of the two above: each rank reads only its own
  // range of every tensor of a full-state-dict file's model and optimizer groups
  // (state_slices.hpp's StateSliceSource: hyperslab reads), from a file of any mode
  // or world size, into its shards and a fresh optimizer state it adopts -- no full
  // tensor and no second copy of the state is ever held. Checked like the full loads;
  // when any rank's group is bad every rank throws, naming the file.
  void load_local_slices(const StateSliceSource& model, const StateSliceSource& optimizer);

 private:
  struct Entry {
    nn::Parameter* param = nullptr;
    std::string name;
    tensor::Shape shape;
    std::int64_t offset = 0;  // into the flat buffer
    std::int64_t numel = 0;
  };
  struct Flat {
    std::string name;                          // the shard's name in the optimizer: "_fsdp.<unit>.flat_param[.<dtype>]"
    tensor::DType dtype = tensor::DType::f32;  // the model's (gathered buffers, full gradients)
    tensor::Device device = tensor::Device::cpu();
    std::vector<Entry> entries;
    std::int64_t numel = 0, padded = 0, shard_numel = 0;
    std::unique_ptr<nn::Parameter> shard;  // stable address: the optimizer holds it; master dtype
    Tensor full;                           // gathered parameters, while the unit is gathered
    Tensor full_grad;                      // the unit's full local gradient, in backward and under no_sync
    Tensor reduced;                        // this rank's block of a reduce-scatter in flight
  };
  enum class UnitState { sharded, gathering, gathered };
  struct Unit {
    std::string path;
    std::vector<Flat> flats;
    UnitState state = UnitState::sharded;
    std::vector<collectives::Work> gathers;
    std::vector<collectives::Work> reduce_scatters;
  };
  struct Leaf {
    nn::Module* module = nullptr;
    std::string path;
    std::size_t unit = kNoUnit;
  };
  static constexpr std::size_t kNoUnit = static_cast<std::size_t>(-1);

  // Construction (fsdp_wrap.cpp).
  std::vector<std::string> choose_unit_paths();
  void build_units(const std::vector<std::string>& paths);
  void build_leaves();
  void install_hooks();
  std::vector<std::pair<std::string, std::string>> shared_parameter_names();

  // Runtime (fsdp.cpp).
  void launch_gather(std::size_t u, bool ahead);
  void ensure_gathered(std::size_t u, const std::vector<std::size_t>& order, bool prefetch);
  void prefetch_after(std::size_t u, const std::vector<std::size_t>& order);
  void bind_gradients(std::size_t u);
  void release_parameters(std::size_t u);
  void after_unit_backward(std::size_t u, bool post);
  void finish_reduce_scatter(std::size_t u);
  void launch_reduce_scatter(std::size_t u);
  void note_bytes(std::ptrdiff_t delta);
  void wait_all() noexcept;
  double clip(double max_norm, collectives::Communicator* tp, const std::function<bool(const std::string&)>& split);
  double scale_gradients(double max_norm, double total);  // clipping to `total`, the norm; returns it
  std::size_t unit_index(const std::string& path) const;

  // State dicts (fsdp_state_dict.cpp).
  Tensor gather_range(const Flat& flat, const Tensor& local, std::int64_t offset, std::int64_t numel);
  // A state-dict key's full shape and dtype (a buffer's, or a parameter's in its flat).
  std::pair<tensor::Shape, tensor::DType> full_tensor_type(const std::string& key) const;
  void agree_or_throw(const std::string& local_error, const char* op);

  nn::Module& module_;
  collectives::Communicator& comm_;
  FsdpOptions options_;
  std::vector<Unit> units_;
  std::vector<Leaf> leaves_;
  std::vector<nn::Module*> hooked_;                          // hook mode (install_hooks): the units' modules
  std::size_t root_unit_ = kNoUnit;                          // hook mode: the unit of the root's own parameters
  std::vector<std::size_t> forward_order_, backward_order_;  // units by first use
  std::vector<std::size_t> first_leaf_, last_leaf_;          // per unit, leaf indices
  std::vector<std::string> state_keys_;                      // module.state_dict() order
  std::unordered_map<std::string, std::pair<std::size_t, std::size_t>> flat_of_;  // param -> (unit, flat)
  std::unordered_map<std::string, std::size_t> entry_of_;                         // param -> entry index
  std::unordered_map<std::string, Tensor*> buffers_;
  std::unordered_set<std::string> aliases_;  // a shared parameter's other names (flat_of_ has them too)
  std::shared_ptr<OffloadMemory> pool_;      // before optimizer_: its state is allocated here
  std::unique_ptr<nn::Optimizer> optimizer_;
  bool keeps_parameters() const { return options_.sharding_strategy == FsdpOptions::ShardingStrategy::shard_grad_op; }
  // shard_grad_op: whether the gathered parameters may lag the shards (the optimizer
  // stepped since they were gathered, or a state dict was loaded).
  void mark_parameters_stale() { parameters_stale_ = true; }
  void refresh_stale_parameters();

  std::size_t pending_reduce_ = kNoUnit;  // the unit whose reduce-scatter is in flight
  std::int64_t gathered_at_step_ = 0;     // shard_grad_op: the optimizer's step count at the last gather
  bool parameters_stale_ = false;
  std::size_t gathered_bytes_ = 0;
  FsdpStats stats_;
  bool sync_ = true;
  bool busy_ = false;  // inside forward or backward
};

}  // namespace troupe::parallel
