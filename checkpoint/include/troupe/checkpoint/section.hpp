// Sections: how a piece of training state gets into and out of a checkpoint without the
// checkpoint module knowing what it is.
//
// A section is one top-level group of the file ("/model", "/optimizer", "/sampler", ...).
// Whoever owns a piece of state registers a StateSource for it: `save` is handed a
// SectionWriter and writes tensors (datasets) and attributes; `load` is handed a
// SectionReader over the same group. Tensor names may contain '/', which makes subgroups:
// an optimizer's "layers.0.weight/exp_avg" lands at /optimizer/layers.0.weight/exp_avg.
//
// SectionWriter::tensor() writes to the file at once, so a `save` that produces tensors
// one at a time (assembling shards, say) keeps memory bounded by the largest tensor.
// The helpers write_state_dict / read_state_dict work with any insertion-ordered map of
// (name, Tensor) pairs that has insert(name, tensor), such as nn::StateDict, without
// this module depending on nn.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/sink.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint {

class SectionWriter {
 public:
  SectionWriter(Sink& sink, std::string section);
  void tensor(std::string_view name, const tensor::Tensor& t);
  // The writer's reusable buffer (FileWriter::scratch): fill it, then pass it to tensor().
  tensor::Tensor scratch(const tensor::Shape& shape, tensor::DType dtype) { return file_.scratch(shape, dtype); }
  // An attribute on the section's group ("/sampler": epoch=3, index=1280).
  void attribute(std::string_view name, const AttrValue& value);
  const std::string& group() const { return group_; }

 private:
  Sink& file_;
  std::string group_;  // "/model"
};

class SectionReader {
 public:
  SectionReader(const FileReader& file, std::string section);
  // Names relative to the section ("layers.0.weight/exp_avg"), in the order written.
  const std::vector<std::string>& tensor_names() const { return names_; }
  bool has_tensor(std::string_view name) const;
  // Reads one tensor (CPU, checksum verified); FormatError naming file and dataset if absent.
  tensor::Tensor tensor(std::string_view name) const;
  // Reads one tensor straight into `dst` (a live parameter: no allocation), verified.
  void read_into(std::string_view name, const tensor::Tensor& dst) const;
  // A tensor's dtype, shape and checksum, as listed when the section was opened.
  const TensorInfo& info(std::string_view name) const;
  // Elements [begin, end) of a tensor in flat C order (FileReader::read_range: only those
  // bytes are read, and not checked on their own -- a sharded resume verifies the
  // file first, each rank its share of the checksums).
  tensor::Tensor read_range(std::string_view name, std::int64_t begin, std::int64_t end) const;
  // The range [begin, begin + dst.numel()) into `dst` (FileReader::read_range_into).
  void read_range_into(std::string_view name, std::int64_t begin, const tensor::Tensor& dst) const;
  const std::string& file_path() const { return file_.path(); }
  const Attributes& attributes() const { return attributes_; }
  const std::string& group() const { return group_; }

 private:
  // "/<section>/<name>", or FormatError naming the file when the section lacks it.
  std::string checked_path(std::string_view name) const;

  const FileReader& file_;
  std::string group_;
  std::vector<std::string> names_;
  std::vector<TensorInfo> infos_;  // names_[i]'s
  Attributes attributes_;
};

struct StateSource {
  std::function<void(SectionWriter&)> save;
  std::function<void(const SectionReader&)> load;
  // A file without this section is skipped by load_latest() as unusable when true; when
  // false, load is simply not called (state added to a program after older checkpoints).
  bool required = true;
};

// How write_state_dict stores the dict's top-level 0-dim f64 and i64 entries (an
// optimizer's "lr", "betas.0", "step"): as datasets like everything else, or as
// attributes of the section's group, which is where DESIGN.md puts hyper-parameters
// and the step count. Both read back to the same dict, bit for bit.
enum class Scalars { as_datasets, as_attributes };

namespace detail {
bool is_attribute_scalar(std::string_view name, const tensor::Tensor& t);
AttrValue scalar_value(const tensor::Tensor& t);
tensor::Tensor scalar_tensor(const AttrValue& value);  // undefined for strings
}  // namespace detail

template <class Dict>
void write_state_dict(SectionWriter& out, const Dict& dict, Scalars scalars = Scalars::as_datasets) {
  for (const auto& [name, value] : dict) {
    if (scalars == Scalars::as_attributes && detail::is_attribute_scalar(name, value))
      out.attribute(name, detail::scalar_value(value));
    else
      out.tensor(name, value);
  }
}

// The inverse: every tensor of the section, and with Scalars::as_attributes first every
// int64/float64 attribute of the section as a 0-dim i64/f64 tensor.
template <class Dict>
Dict read_state_dict(const SectionReader& in, Scalars scalars = Scalars::as_datasets) {
  Dict dict;
  if (scalars == Scalars::as_attributes)
    for (const auto& [name, value] : in.attributes())
      if (tensor::Tensor t = detail::scalar_tensor(value); t.defined()) dict.insert(name, t);
  for (const std::string& name : in.tensor_names()) dict.insert(name, in.tensor(name));
  return dict;
}

}  // namespace troupe::checkpoint
