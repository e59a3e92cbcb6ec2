// register_state_groups: wires a source that saves and restores several sections at
// once -- train::TrainingState with `state_dicts()` returning (group name, state dict)
// pairs and `load_state_dicts(groups)` taking them all back -- into a Checkpoint, one
// section per group, without this module knowing the source's types.
//
//   checkpoint::register_state_groups(ckpt, training_state);   // the groups it has now
//   checkpoint::register_state_groups(ckpt, training_state, {"model", "optimizer"});
//
// "model" keeps its 0-dim tensors as datasets (PyTorch lists buffers such as
// num_batches_tracked in its state_dict); every other group stores its 0-dim f64/i64
// entries as attributes of its HDF5 group (hyper-parameters, step counts, sampler
// position), as DESIGN.md lays the file out. Both read back bit for bit. Loading calls
// load_state_dicts once, with every group, after the last section is read.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/save_manifest.hpp"

namespace troupe::checkpoint {

inline Scalars scalars_for_group(const std::string& name) {
  return name == "model" ? Scalars::as_datasets : Scalars::as_attributes;
}

template <class Source>
void register_state_groups(Checkpoint& ckpt, Source& source, const std::vector<std::string>& names) {
  using Groups = std::decay_t<decltype(source.state_dicts())>;
  using Dict = typename Groups::value_type::second_type;
  TROUPE_CHECK(!names.empty(), "register_state_groups: no group names");
  auto pending = std::make_shared<Groups>();
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string name = names[i];
    const bool last = i + 1 == names.size();
    ckpt.register_state(name, {.save =
                                   [&source, name](SectionWriter& w) {
                                     Groups groups = source.state_dicts();
                                     for (const auto& [group, dict] : groups)
                                       if (group == name) return write_state_dict(w, dict, scalars_for_group(name));
                                     TROUPE_THROW(InvalidArgument, "register_state_groups: the source has no group '",
                                                  name, "'");
                                   },
                               .load =
                                   [&source, name, last, pending](const SectionReader& r) {
                                     pending->emplace_back(name, read_state_dict<Dict>(r, scalars_for_group(name)));
                                     if (!last) return;
                                     Groups groups = std::move(*pending);
                                     pending->clear();
                                     source.load_state_dicts(groups);
                                   }});
  }
}

// The same layout for a save that builds a SaveManifest rather than writing sections
// (ParallelCheckpoint): each entry of group `name`'s `dict` becomes an attribute of
// /name where scalars_for_group(name) makes its scalars attributes, else the tensor
// /name/<key>, for which `tensor(value)` is called right after the manifest gets it.
template <class Dict, class OnTensor>
void add_state_group(SaveManifest& manifest, const std::string& name, const Dict& dict, OnTensor&& tensor) {
  const std::string group = "/" + name;
  const bool as_attributes = scalars_for_group(name) == Scalars::as_attributes;
  for (const auto& [key, value] : dict) {
    if (as_attributes && detail::is_attribute_scalar(key, value)) {
      manifest.attributes.push_back({group, key, detail::scalar_value(value)});
      continue;
    }
    manifest.add_tensor(group + "/" + key, value.dtype(), value.shape());
    tensor(value);
  }
}

// Every group the source returns at the time of the call (a TrainingState without a
// GradScaler has no "scaler" group, and so no such section).
template <class Source>
void register_state_groups(Checkpoint& ckpt, Source& source) {
  std::vector<std::string> names;
  for (const auto& [group, dict] : source.state_dicts()) names.push_back(group);
  register_state_groups(ckpt, source, names);
}

}  // namespace troupe::checkpoint
