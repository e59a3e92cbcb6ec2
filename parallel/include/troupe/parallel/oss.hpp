// OSS: optimizer state sharding (ZeRO stage 1, fairscale's OSS).
//
// Wraps any troupe optimizer, given as a factory, e.g.
//   OSS oss(model.named_parameters(), comm,
//           [](auto params) { return std::make_unique<nn::AdamW>(std::move(params), 1e-3); });
// The parameters are partitioned across the ranks by a greedy byte balance
// (partition_parameters: largest first, each to the least loaded rank; the same on
// every rank because it depends only on the parameters' sizes and order). Each rank
// builds the base optimizer over its own partition, so it allocates the optimizer
// state (momentum, Adam's moments) of about 1/W of the model, and step() updates
// only that partition; the updated parameters then reach every rank -- by one
// broadcast per parameter from its owner, or, on request, windowed all-gathers of a
// flat buffer (every rank's partition padded to the largest) -- so all ranks hold
// identical parameters after every step.
//
// Gradients: step() reads the grads of the owned parameters only. With plain DDP
// (ZeRO-1) every rank holds every averaged gradient and simply ignores the others;
// with ShardedDataParallel (ZeRO-2, sharded_ddp.hpp) only the owned ones exist.
//
// Collective contract: step(), state_dict(), load_state_dict() and clip_grad_norm()
// are collectives over `comm`: every rank calls them together, in the same order.
// With one rank nothing is communicated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"
#include "troupe/parallel/state_slices.hpp"

namespace troupe::parallel {

class GradScaler;

// Builds the base optimizer over the parameters it is given (possibly none, on a rank
// that owns nothing when there are more ranks than parameters).
using OptimizerFactory = std::function<std::unique_ptr<nn::Optimizer>(std::vector<nn::NamedParameter>)>;

// The owner rank of each parameter (parallel to `params`): the parameters by bytes,
// largest first (ties: earlier first), each to the rank with the fewest bytes so far
// (ties: lowest rank). Deterministic: every rank computes the same answer.
std::vector<int> partition_parameters(const std::vector<nn::NamedParameter>& params, int world_size);

struct OssOptions {
  // How the updated parameters are shared after step().
  // automatic is broadcast. Whole-parameter partitions are uneven (a 16M-element
  // matrix among 4M ones), and an all-gather moves every rank's padded to the
  // largest: 1.3x the model at 2 ranks, 2.7x at 4 on the 25M MLP, plus a copy into
  // and out of the flat buffer. Broadcasts move each parameter once, in place; they
  // were faster on every model measured (docs/SHARDING.md).
  enum class Sync {
    automatic,
    all_gather,  // all-gathers of a flat buffer (one per window of it, below); one dtype, CPU
    broadcast,   // one broadcast per parameter from its owner
  };
  Sync sync = Sync::automatic;
  // all_gather moves the partitions through a flat buffer of at most this many bytes
  // (all ranks' windows together), one all-gather per window: a buffer of the whole
  // model would add 4N bytes to ZeRO-1's peak, where its point is to shed memory.
  std::size_t sync_bucket_bytes = std::size_t{25} << 20;
};

class OSS {
 public:
  OSS(std::vector<nn::NamedParameter> params, collectives::Communicator& comm, const OptimizerFactory& factory,
      OssOptions options = {});
  OSS(const OSS&) = delete;
  OSS& operator=(const OSS&) = delete;

  // Steps the base optimizer over the owned partition, then shares the parameters.
  void step();
  // What step() ends with: every parameter from its owner to every rank. For a caller
  // that steps base() itself and shares later (a pipeline's fsdp, at the next use).
  void share();
  // Loss-scaled step (torch's scaler.step(optimizer)): unscales this rank's owned
  // gradients (unless scaler.unscale_ already did) and checks them for inf/NaN; the
  // scaler all-reduces the verdict, so an overflow in any rank's shard skips the step
  // on every rank. Steps and shares the parameters only then; true if it stepped.
  // Call scaler.update() afterwards, as usual. The scaler's communicator must be this
  // OSS's (or another over the same ranks, used in the same order).
  bool step(GradScaler& scaler);
  // Over every parameter (not only the owned ones), with nn::Optimizer's meaning.
  void zero_grad(bool set_to_none = true);

  double lr() const { return base_->lr(); }
  void set_lr(double lr) { base_->set_lr(lr); }
  std::int64_t step_count() const { return base_->step_count(); }
  // The optimizer over this rank's partition. It exists on every rank, so an LR
  // schedule may drive it (nn::StepLR(oss.base(), ...)) as long as every rank does.
  nn::Optimizer& base() { return *base_; }
  const nn::Optimizer& base() const { return *base_; }

  const std::vector<nn::NamedParameter>& named_parameters() const { return params_; }
  // Owner rank of each parameter, parallel to named_parameters().
  const std::vector<int>& owners() const { return owners_; }
  // Throws InvalidArgument when `name` is not one of the parameters.
  int owner(const std::string& name) const;
  bool owns(const std::string& name) const { return owner(name) == comm_.rank(); }
  // The parameters owned by `rank`, in named_parameters() order.
  std::vector<nn::NamedParameter> partition(int rank) const;
  // Bytes of the parameters each rank owns (parallel to ranks).
  std::vector<std::size_t> partition_bytes() const;
  // Bytes of this rank's optimizer state: the base optimizer's per-parameter state
  // tensors (not the hyper-parameters).
  std::size_t local_state_bytes() const;
  bool uses_all_gather() const { return all_gather_; }

  // The full, unsharded state, the same on every rank: exactly what the base optimizer
  // type would return had it been built over every parameter (same keys, same order:
  // lr, step, hyper-parameters, then "<param>/<slot>" in named_parameters() order), so a
  // checkpoint does not depend on the world size or on the sharding. Collective: it is
  // all-gathered to every rank (two all-gathers: a manifest, then the bytes), so each
  // rank briefly holds the whole optimizer state.
  nn::StateDict state_dict() const;
  // state_dict() for the parallel save, with no tensor bytes moved: its entries without
  // '/' (the same on every rank) and its "<param>/<slot>" entries as this rank's pieces
  // -- each whole on the parameter's owner, none elsewhere. Collective: one all-gather
  // of the slots' names, dtypes and shapes. Holds a copy of this rank's own state.
  LocalStateSlices local_state_slices() const;
  // Takes a full state dict (from state_dict() at any world size, or from an unsharded
  // optimizer of the same type); each rank keeps its partition's entries. Collective:
  // when any rank rejects the dict, every rank restores its previous state and throws
  // InvalidArgument (the rejecting rank's reason, or which rank rejected it).
  void load_state_dict(const nn::StateDict& dict);

  // Clips the gradients of the owned parameters so that the global norm (over every
  // parameter, gathered from each owner's part with one all-reduce) is at most
  // `max_norm`; returns the norm before clipping. Only owned grads matter to step().
  double clip_grad_norm(double max_norm);

 private:
  void build_flat_layout();
  void share_by_all_gather();
  void share_by_broadcast();

  std::vector<nn::NamedParameter> params_;
  collectives::Communicator& comm_;
  std::vector<int> owners_;
  std::unordered_map<std::string, std::size_t> index_;
  std::unique_ptr<nn::Optimizer> base_;
  bool all_gather_ = false;
  // all_gather: rank r's partition at [r * segment_, r * segment_ + its numel) of a
  // virtual flat buffer, moved a window at a time through a buffer of at most
  // sync_bucket_bytes_ allocated for each step.
  std::int64_t segment_ = 0;
  std::size_t sync_bucket_bytes_ = 0;
  std::vector<std::int64_t> flat_offset_;  // parallel to params_, within the owner's segment
};

}  // namespace troupe::parallel
