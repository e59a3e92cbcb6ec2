// Snapshot: a checkpoint's content held in host memory, recorded in the order it was
// written, to be replayed into a FileWriter later -- the first half of an asynchronous
// save. Recording copies every tensor to the host; a tensor built in scratch() is kept
// without a second copy. Memory is the whole state, which is the price of not stalling
// training for the disk. Large host tensors are copied at finish(), all at once over
// the cores this process may run on (at most 4), so training may change the originals
// once finish() has returned (replay() and release_buffers() finish first); they are
// held until then, so they may be dropped at once. One core copied 12.7 GB/s here, two
// 22 GB/s, but only on one batch: a thread started per 10 MB tensor gained 15%.
//
// Buffers can be recycled from the previous snapshot (the constructor's `spare`): a copy
// into memory that is already mapped runs at memcpy speed, while fresh allocations pay a
// page fault per 4 KB page, which on these VMs triples the stall of an async save.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "troupe/checkpoint/sink.hpp"

namespace troupe::checkpoint {

class Snapshot final : public Sink {
 public:
  // `spare`: tensors (from release_buffers) whose storage this snapshot may reuse.
  explicit Snapshot(std::vector<tensor::Tensor> spare = {});

  void ensure_group(std::string_view group) override;
  void set_attribute(std::string_view group, std::string_view name, const AttrValue& value) override;
  void write_tensor(std::string_view path, const tensor::Tensor& t) override;
  tensor::Tensor scratch(const tensor::Shape& shape, tensor::DType dtype) override;

  // Makes the copies still pending (see above).
  void finish();
  // Sends everything recorded, in order, to `out` (after finish()).
  void replay(Sink& out);
  // Tensor bytes held.
  std::size_t bytes() const { return bytes_; }
  // Gives up the recorded tensors (after replay) so a later snapshot can reuse them.
  std::vector<tensor::Tensor> release_buffers();

 private:
  struct Op {
    enum class Kind { group, attribute, tensor } kind;
    std::string path;  // group or dataset
    std::string name;  // attribute name
    AttrValue value;
    tensor::Tensor tensor;
  };
  struct PendingCopy {
    tensor::Tensor to, from;
  };
  std::vector<Op> ops_;
  std::vector<PendingCopy> pending_;
  std::unordered_set<const tensor::Storage*> scratch_;  // handed out by scratch(), ours
  std::multimap<std::size_t, tensor::Tensor> spare_;    // by byte size
  std::size_t bytes_ = 0;
};

}  // namespace troupe::checkpoint
