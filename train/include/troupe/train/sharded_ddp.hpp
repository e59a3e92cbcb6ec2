// ShardedDataParallel: ZeRO stage 2 (fairscale's ShardedDDP, PyTorch's SHARD_GRAD_OP)
// -- gradients reduce-scattered so that each rank keeps only the gradients of the
// parameters its OSS owns, then OSS steps its partition and shares the parameters.
//
//   OSS oss(model.named_parameters(), comm, factory);
//   ShardedDataParallel sdp(model, oss, comm);
//   loss.forward(sdp.forward(x), y); sdp.backward(loss.backward()); oss.step(); oss.zero_grad();
//
// Buckets are built as DDP's (ddp.hpp): the parameters in reverse named order, cut at
// about `bucket_bytes`, one dtype per bucket. Inside a bucket the gradients are
// grouped by owner: rank r's parameters fill block r of W equal blocks (each padded to
// the bucket's largest owner share), so one reduce_scatter(avg) of the bucket hands
// every rank the averaged gradients of exactly its own parameters. A bucket's
// reduce-scatter starts from nn's grad-ready hook the moment its last gradient is
// final, while the earlier layers' backward still runs (same launch-in-bucket-order
// rule as DDP, so every rank issues the same collectives in the same order).
//
// Memory: the bucket buffers (the full local gradients) exist only from the start of
// a backward until its reduce-scatters complete -- backward() allocates them and frees
// them before returning. Between steps a rank holds only its owned gradients, in one
// persistent flat shard of about 1/W of the model (plus the bucket padding); the grads
// of parameters it does not own are left undefined. Under no_sync the buckets live on
// across backward calls and accumulate the local gradients in full, as they must.
//
// Gradient semantics match DDP for the owned parameters: the first synchronising
// backward after a zero_grad leaves the average over ranks; without zero_grad the new
// average is added to the owned gradients. The grads of parameters a rank does not own
// are meaningless to it after a synchronising backward (they are undefined).
//
// Contract: as DDP's -- every rank calls backward() the same number of times with the
// same sync setting, from one thread; the module and the OSS outlive this object; the
// OSS was built over module.named_parameters() (checked at construction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/train/ddp.hpp"
#include "troupe/train/oss.hpp"

namespace troupe::train {

struct ShardedDdpOptions {
  // Bytes of (unpadded) gradients per bucket, as DdpOptions::bucket_bytes.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // Broadcast parameters and buffers from rank 0 at construction.
  bool broadcast_from_rank0 = true;
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
  class NoSync {
   public:
    explicit NoSync(ShardedDataParallel& sdp) : sdp_(&sdp), previous_(sdp.sync_) { sdp.sync_ = false; }
    NoSync(NoSync&& other) noexcept : sdp_(other.sdp_), previous_(other.previous_) { other.sdp_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync() {
      if (sdp_) sdp_->sync_ = previous_;
    }

   private:
    ShardedDataParallel* sdp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool sync_enabled() const { return sync_; }

  // The bucket layout: parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  const SyncStats& last_sync_stats() const { return stats_; }
  // Bytes of gradient storage this object holds right now: the owned shard, plus the
  // bucket buffers while they exist (inside a backward or a no_sync window).
  std::size_t gradient_bytes() const;
  // Elements of padding the reduce-scatter moves per step (all buckets, all blocks).
  std::int64_t padding_elements() const;

 private:
  struct Slot {
    nn::Parameter* param = nullptr;
    std::string name;
    bool owned = false;
    std::int64_t offset = 0;  // elements into the bucket (block owner * block + place in the block)
    Tensor view;              // the grad's home in the bucket, while the bucket exists
    Tensor shard;             // owned only: the grad's home between steps
    bool ready = false;
    bool live = false;  // owned only: the shard holds a gradient to add to (no zero_grad since)
  };
  struct Bucket {
    tensor::DType dtype = tensor::DType::f32;
    tensor::Device device = tensor::Device::cpu();
    std::int64_t block = 0;  // elements per rank
    std::int64_t used = 0;   // unpadded elements
    Tensor flat;             // W * block elements; undefined between steps
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
  OSS& oss_;
  collectives::Communicator& comm_;
  ShardedDdpOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<Tensor> shards_;  // one flat shard per bucket: this rank's block
  std::unordered_map<const nn::Parameter*, std::pair<std::size_t, std::size_t>> where_;
  std::size_t next_launch_ = 0;
  bool sync_ = true;
  bool in_backward_ = false;
  SyncStats stats_;
};

}  // namespace troupe::train
