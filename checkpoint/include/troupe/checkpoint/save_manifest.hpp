// SaveManifest: what one multi-rank save writes -- the full tensors (name, dtype, full
// shape) in file order, the section attributes and the root metadata -- as opposed to
// the bytes, which each rank holds a piece of. Both multi-rank saves take one: the
// gathered save (CheckpointActor, checkpoint_actor.hpp) and the parallel save
// (ParallelCheckpoint, parallel_checkpoint.hpp). Every rank passes the same manifest.
//
// A rank's piece of a tensor is a contiguous range of its elements in flat C order;
// shard_range() is the split troupe's sharded optimizers use and loads re-slice with. A
// slice of rows [r0, r1) along dim 0 is the element range [r0 * row, r1 * row), where
// row is the product of the other dimensions.
#pragma once

#include <cereal/types/string.hpp>
#include <cereal/types/variant.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/shard_range.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint {

struct TensorSpec {
  std::string path;   // "/model/layers.0.weight"
  std::string dtype;  // "f32"
  std::vector<std::int64_t> shape;
  bool operator==(const TensorSpec&) const = default;
  template <class A>
  void serialize(A& ar) {
    ar(path, dtype, shape);
  }
};

struct AttributeSpec {
  std::string group;  // "/sampler"
  std::string name;
  AttrValue value;
  bool operator==(const AttributeSpec&) const = default;
  template <class A>
  void serialize(A& ar) {
    ar(group, name, value);
  }
};

struct SaveManifest {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t world_size = 1;
  std::string run_id;
  std::string config_json = "{}";
  std::vector<TensorSpec> tensors;        // file order
  std::vector<AttributeSpec> attributes;  // section attributes (sampler, status, ...)
  // Groups created first, in this order, even when nothing is written into them: the
  // sections ("/model", ..., "/rng"), so that an empty one (a model without Dropout has
  // an empty /rng) exists as it does in a Checkpoint's file, and the groups come in its order.
  std::vector<std::string> groups;

  // Adds a tensor by full name and a tensor of its full shape and dtype; returns its index.
  std::int64_t add_tensor(std::string path, tensor::DType dtype, const tensor::Shape& shape);
  bool operator==(const SaveManifest&) const = default;
  template <class A>
  void serialize(A& ar) {
    ar(step, epoch, world_size, run_id, config_json, tensors, attributes, groups);
  }
};

// The layout troupe's sharded optimizers use, and how load re-slices (troupe/shard_range.hpp).
using troupe::shard_range;

}  // namespace troupe::checkpoint
