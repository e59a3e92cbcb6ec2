// ShardedDataParallel: ZeRO stage 2 (fairscale's ShardedDDP, PyTorch's SHARD_GRAD_OP)
// -- each rank keeps only the averaged gradients of the parameters its OSS owns, then
// OSS steps its partition and shares the parameters.
//
//   OSS oss(model.named_parameters(), comm, factory);
//   ShardedDataParallel sdp(model, oss, comm);
//   loss.forward(sdp.forward(x), y); sdp.backward(loss.backward()); oss.step(); oss.zero_grad();
//
// Buckets: the parameters in reverse named order (the order backward finishes them,
// as DDP's, ddp.hpp), cut at about `bucket_bytes`, at a dtype or device change, and
// wherever the owner changes -- so every bucket belongs to one rank. The moment its
// last gradient is final (nn's grad-ready hook, while the earlier layers' backward
// still runs) a bucket is averaged over the ranks for its owner, by one collective:
// by default an all-reduce whose result only the owner keeps (the collectives' own
// shared-memory/ring path, which sums in rank order, so the owner's gradients are
// bit for bit DDP's at any world size), or a reduce to the owner, which moves each
// gradient once (ShardedDdpOptions::reduction: the same bits on one node, where the
// collectives reduce through shared memory; MPI_Ireduce across nodes). Buckets
// launch in order, so every rank issues the same collectives in the same order. OSS
// owns whole parameters, so a bucket of one large parameter cannot be split among
// the ranks; a reduce-scatter of it would need every rank's block as large as the
// owner's share (W times the bucket, padding included): hence one owner per bucket.
// A model whose small parameters alternate owners gets many small buckets (one
// collective each).
//
// Memory: a bucket's buffer (the local gradients) is allocated just before its
// gradients are computed -- when the bucket before it launches -- and freed on the
// ranks that do not own it once its reduction is done; the owner keeps it as the
// home of its averaged gradients until the next backward. Before a buffer is
// allocated, the reductions of all buckets but the latest are waited for. So during
// a synchronising backward a rank holds its owned gradients plus at most two buckets
// (one filling, one being reduced; peak_gradient_bytes()), and between steps only
// its owned gradients: summed over ranks, the model's gradients once, no padding.
// The grads of parameters a rank does not own are undefined after a synchronising
// backward. Under no_sync every bucket is allocated and accumulates the local
// gradients in full across backward calls, as it must.
//
// Gradient semantics match DDP for the owned parameters: the first synchronising
// backward after a zero_grad leaves the average over ranks; without zero_grad the new
// average is added to the owned gradients. The grads of parameters a rank does not own
// are meaningless to it after a synchronising backward (they are undefined). After a
// backward that threw, the gradients are unspecified: zero_grad before going on.
//
// Contract: as DDP's -- every rank calls backward() the same number of times with the
// same sync setting, from one thread; the module and the OSS outlive this object; the
// OSS was built over module.named_parameters() (checked at construction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/no_sync.hpp"
#include "troupe/parallel/oss.hpp"

namespace troupe::parallel {

struct ShardedDdpOptions {
  // Bytes of gradients per bucket, as DdpOptions::bucket_bytes (a bucket is also cut
  // where the owner changes, so buckets may be smaller).
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // Broadcast parameters and buffers from rank 0 at construction.
  bool broadcast_from_rank0 = true;
  // How a bucket's gradients reach its owner. Both leave the owner the average over
  // ranks; they differ in cost and in summation order.
  enum class Reduction {
    allreduce,  // Communicator::allreduce_async, the other ranks dropping the result:
                // twice a reduce's bytes, but through the collectives' own shared-memory
                // or ring path, summing in rank order as DDP's all-reduce does (bit for
                // bit DDP's gradients). On the 2-core VM: as fast as DDP on the 25M MLP.
    reduce,     // Communicator::reduce_async to the owner: each gradient crosses once
                // (ZeRO-2's volume). On one node the collectives' shared-memory reduce
                // has the all-reduce's bits and its speed (it saves only the non-owners'
                // copying out); across nodes it is MPI_Ireduce (about 3x slower per step
                // in one run here, and at 3+ ranks summing in MPI's order: AdamW runs
                // drift ~1e-5 from DDP's in 20 steps)
  };
  Reduction reduction = Reduction::allreduce;
};

class ShardedDataParallel {
 public:
  ShardedDataParallel(nn::Module& module, OSS& optimizer, collectives::Communicator& comm,
                      ShardedDdpOptions options = {});
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;
  // Removes the hook and waits for collectives still in flight. Never throws.
  ~ShardedDataParallel();

  nn::Module& module() { return module_; }
  OSS& optimizer() { return oss_; }

  Tensor forward(const Tensor& input) { return module_.forward(input); }
  // The module's backward; with sync on, the owned gradients come back averaged over
  // ranks and the others undefined.
  Tensor backward(const Tensor& grad_output);

  // While the returned guard lives, backward() only accumulates gradients locally.
  [[nodiscard]] NoSync no_sync() { return NoSync(sync_); }
  bool sync_enabled() const { return sync_; }

  // The bucket layout: parameter names per bucket, in launch order, and each
  // bucket's owner rank (parallel).
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  std::vector<int> bucket_owners() const;
  const SyncStats& last_sync_stats() const { return stats_; }
  // Bytes of gradient storage this object holds right now: the owned gradients, plus
  // the bucket buffers that exist (inside a backward or a no_sync window).
  std::size_t gradient_bytes() const;
  // The most gradient_bytes() held at once during the last backward.
  std::size_t peak_gradient_bytes() const { return peak_bytes_; }

 private:
  struct Slot {
    nn::Parameter* param = nullptr;
    std::string name;
    std::int64_t offset = 0;  // elements into the bucket
    Tensor view;              // the grad's home in the bucket's buffer, while it exists
    bool ready = false;
    bool live = false;  // owner only: its kept gradient is to be added to (no zero_grad since)
  };
  struct Bucket {
    tensor::DType dtype = tensor::DType::f32;
    tensor::Device device = tensor::Device::cpu();
    int owner = 0;
    std::int64_t numel = 0;
    Tensor flat;  // the local gradients: from just before they are computed until reduced
    Tensor kept;  // on the owner: the averaged gradients, between backwards
    std::vector<Slot> slots;
    int pending = 0;
    bool launched = false;
    collectives::Work work;
  };

  void broadcast_state();
  void build_buckets();
  void prepare();
  void bind(std::size_t b);
  void on_grad_ready(const std::string& name, nn::Parameter& param);
  void launch_ready_buckets();
  void harvest_finished();
  void harvest(std::size_t b);
  void finish_sync();

  nn::Module& module_;
  OSS& oss_;
  collectives::Communicator& comm_;
  ShardedDdpOptions options_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const nn::Parameter*, std::pair<std::size_t, std::size_t>> where_;
  std::size_t next_launch_ = 0;   // buckets before it are launched
  std::size_t next_harvest_ = 0;  // buckets before it are reduced and released
  bool sync_ = true;
  bool in_backward_ = false;
  SyncStats stats_;
  std::size_t peak_bytes_ = 0;
};

}  // namespace troupe::parallel
