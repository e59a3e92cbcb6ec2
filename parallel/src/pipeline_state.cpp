// A pipeline's state as checkpoints keep it: every stage's entries gathered in the whole
// model's order, and each rank's taken back (pipeline.hpp, PipelineStateDicts).
#include "troupe/parallel/pipeline.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::parallel {

using collectives::Buffer;

// ------------------------------------------------------------ checkpoints

namespace {

constexpr std::size_t kMaxEntryDims = 6;  // of an entry sent with its name and shape

// Every stage's entries in the whole model's stage order: chunks[c] is this rank's
// stage c x p + rank (every rank passes as many). With scalars_once, entries without a
// '/' (an optimizer's scalars) come from stage 0 alone.
nn::StateDict gather_stages(const std::vector<nn::StateDict>& chunks, collectives::Communicator& pp,
                            bool scalars_once) {
  const int p = pp.size(), v = static_cast<int>(chunks.size());
  nn::StateDict full;
  for (int stage = 0; stage < p * v; ++stage) {
    const int owner = stage % p;
    const bool me = owner == pp.rank();
    nn::StateDict mine;
    if (me)
      for (const auto& [name, value] : chunks[static_cast<std::size_t>(stage / p)])
        if (!scalars_once || stage == 0 || name.find('/') != std::string::npos) mine.insert(name, value);
    std::int64_t count = me ? static_cast<std::int64_t>(mine.size()) : 0;
    pp.broadcast(Buffer(&count, 1), owner);
    auto entry = mine.begin();
    for (std::int64_t e = 0; e < count; ++e) {
      std::vector<std::int64_t> meta(3 + kMaxEntryDims, 0);
      std::string name;
      if (me) {
        name = entry->first;
        meta[0] = static_cast<std::int64_t>(name.size());
        meta[1] = static_cast<std::int64_t>(entry->second.dtype());
        meta[2] = entry->second.dim();
        for (std::int64_t d = 0; d < entry->second.dim(); ++d)
          meta[3 + static_cast<std::size_t>(d)] = entry->second.size(d);
      }
      pp.broadcast(Buffer(meta), owner);
      std::vector<std::uint8_t> chars(name.begin(), name.end());
      chars.resize(static_cast<std::size_t>(meta[0]));
      pp.broadcast(Buffer(chars), owner);
      name.assign(chars.begin(), chars.end());
      tensor::Shape shape;
      for (std::int64_t d = 0; d < meta[2]; ++d) shape.push_back(meta[3 + static_cast<std::size_t>(d)]);
      // On the host, as every state dict travels (a GPU stage's entries copied there).
      Tensor value =
          me ? (entry->second.device().is_cpu() ? entry->second.clone() : entry->second.to(tensor::Device::cpu()))
             : Tensor::empty(shape, static_cast<tensor::DType>(meta[1]));
      pp.broadcast(Buffer(value), owner);
      full.insert(name, value);
      if (me) ++entry;
    }
  }
  return full;
}

// An optimizer's state ("parameter/slot" keys, and scalars) split by the chunk holding
// each parameter; the scalars go with chunk 0.
std::vector<nn::StateDict> by_chunk(const nn::StateDict& dict, PipelineStage& stage) {
  const std::vector<PipelineStage*> chunks = stage.chunks();
  std::map<std::string, std::size_t> owner;
  for (std::size_t c = 0; c < chunks.size(); ++c)
    for (const auto& [name, param] : chunks[c]->named_parameters()) owner.emplace(name, c);
  std::vector<nn::StateDict> out(chunks.size());
  for (const auto& [key, value] : dict) {
    const auto cut = key.rfind('/');
    const auto found = cut == std::string::npos ? owner.end() : owner.find(key.substr(0, cut));
    out[found == owner.end() ? 0 : found->second].insert(key, value);
  }
  return out;
}

}  // namespace

nn::StateDict pipeline_full_state_dict(nn::Module& stage, collectives::Communicator& pp,
                                       collectives::Communicator* tp) {
  std::vector<nn::Module*> chunks{&stage};
  if (auto* staged = dynamic_cast<PipelineStage*>(&stage)) {
    const std::vector<PipelineStage*> held = staged->chunks();
    chunks.assign(held.begin(), held.end());
  }
  std::vector<nn::StateDict> dicts;
  for (nn::Module* chunk : chunks) dicts.push_back(tp != nullptr ? full_state_dict(*chunk, *tp) : chunk->state_dict());
  return gather_stages(dicts, pp, false);
}

PipelineStateDicts::PipelineStateDicts(PipelineStage& stage, nn::Optimizer& optimizer, collectives::Communicator& pp,
                                       collectives::Communicator* tp, std::string tied_name)
    : stage_(stage),
      optimizer_(&optimizer),
      oss_(nullptr),
      pp_(pp),
      tp_(tp),
      splits_(tp != nullptr ? tensor_parallel_splits(stage) : std::map<std::string, TensorSplit>{}),
      tied_name_(std::move(tied_name)) {}

PipelineStateDicts::PipelineStateDicts(PipelineStage& stage, OSS& optimizer, collectives::Communicator& pp,
                                       collectives::Communicator* tp, std::string tied_name)
    : PipelineStateDicts(stage, optimizer.base(), pp, tp, std::move(tied_name)) {
  optimizer_ = nullptr;
  oss_ = &optimizer;
}

nn::StateDict PipelineStateDicts::whole_random_state(nn::StateDict local) {
  std::vector<nn::StateDict> chunks(stage_.chunks().size());
  chunks[0] = std::move(local);
  return gather_stages(chunks, pp_, false);
}

std::string PipelineStateDicts::name_of(const nn::Parameter* p) const {
  if (!p) return "";
  for (const auto& [name, param] : stage_.named_parameters())
    if (param == p) return name;
  return "";
}

nn::StateDict PipelineStateDicts::model_state_dict() { return pipeline_full_state_dict(stage_, pp_, tp_); }

nn::StateDict PipelineStateDicts::optimizer_state_dict() {
  const std::string copy = name_of(stage_.tied_copy()), unowned = name_of(stage_.tied_unowned());
  nn::StateDict mine;
  const nn::StateDict local = oss_ != nullptr ? oss_->state_dict() : optimizer_->state_dict();
  for (const auto& [key, value] : tp_ != nullptr ? full_optimizer_state_dict(local, splits_, *tp_) : local) {
    const auto cut = key.rfind('/');
    const std::string param = cut == std::string::npos ? "" : key.substr(0, cut);
    if (!unowned.empty() && param == unowned) continue;  // never stepped here; none expected
    mine.insert(!copy.empty() && param == copy ? tied_name_ + key.substr(cut) : key, value);
  }
  const nn::StateDict full = gather_stages(by_chunk(mine, stage_), pp_, true);
  // The whole model's order: the scalars, the table's slots (its first parameter), the rest.
  nn::StateDict ordered;
  const auto rank = [&](const std::string& key) {
    return key.find('/') == std::string::npos ? 0 : key.rfind(tied_name_ + "/", 0) == 0 ? 1 : 2;
  };
  for (int pass = 0; pass < 3; ++pass)
    for (const auto& [key, value] : full)
      if (rank(key) == pass) ordered.insert(key, value);
  return ordered;
}

void PipelineStateDicts::load_model_state_dict(const nn::StateDict& dict) {
  nn::StateDict mine;
  for (const auto& [name, value] : stage_.state_dict()) mine.insert(name, dict.at(name));
  if (tp_ != nullptr)
    load_full_state_dict(stage_, mine, *tp_);
  else
    stage_.load_state_dict(mine);
}

void PipelineStateDicts::load_optimizer_state_dict(const nn::StateDict& dict) {
  const std::string copy = name_of(stage_.tied_copy());
  std::vector<std::string> names;
  for (const auto& [name, param] : stage_.named_parameters())
    if (param != stage_.tied_unowned()) names.push_back(name);
  nn::StateDict mine;
  for (const auto& [key, value] : dict) {
    const auto cut = key.rfind('/');
    if (cut == std::string::npos) {
      mine.insert(key, value);
      continue;
    }
    const std::string param = key.substr(0, cut), slot = key.substr(cut);
    if (std::find(names.begin(), names.end(), param) != names.end()) mine.insert(key, value);
    if (!copy.empty() && param == tied_name_) mine.insert(copy + slot, value);
  }
  const nn::StateDict part = tp_ != nullptr ? optimizer_state_dict_part(mine, splits_, *tp_) : mine;
  if (oss_ != nullptr)
    oss_->load_state_dict(part);
  else
    optimizer_->load_state_dict(part);
}

}  // namespace troupe::parallel
