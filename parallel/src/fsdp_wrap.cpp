// FSDP construction: choosing the units (auto-wrap policy, manual paths), flattening
// and sharding each unit's parameters, and the leaf schedule forward/backward follow.
#include <algorithm>
#include <set>

#include "troupe/error.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/parallel/fsdp.hpp"
#include "troupe/tensor/meta.hpp"

namespace troupe::parallel {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// True when parameter/module `name` lies in the module at `path` ("" holds everything).
bool inside(const std::string& name, const std::string& path) {
  return path.empty() || name == path ||
         (name.size() > path.size() && name.compare(0, path.size(), path) == 0 && name[path.size()] == '.');
}

nn::Module* find_module(nn::Module& root, const std::string& path) {
  nn::Module* at = &root;
  std::size_t start = 0;
  while (start <= path.size() && !path.empty()) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    nn::Module* next = nullptr;
    for (const auto& child : at->named_children())
      if (child.name == part) next = child.module;
    if (next == nullptr) return nullptr;
    at = next;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return at;
}

struct PolicyWalk {
  const AutoWrapPolicy& policy;
  std::vector<std::string> chosen;
  int considered = 0;
  std::int64_t largest = 0;

  // Returns the parameters of `module` that no unit took.
  std::int64_t visit(nn::Module& module, const std::string& path, bool is_root) {
    std::int64_t own = module.parameter_count();
    for (const auto& child : module.named_children()) own -= child.module->parameter_count();
    std::int64_t unwrapped = own;
    for (const auto& child : module.named_children()) unwrapped += visit(*child.module, join(path, child.name), false);
    if (is_root) return unwrapped;
    ++considered;
    largest = std::max(largest, unwrapped);
    if (policy(module, path, unwrapped)) {
      chosen.push_back(path);
      return 0;
    }
    return unwrapped;
  }
};

}  // namespace

AutoWrapPolicy size_based_auto_wrap_policy(std::int64_t min_num_params) {
  TROUPE_CHECK(min_num_params > 0, "size_based_auto_wrap_policy: min_num_params must be > 0, got ", min_num_params);
  return
      [min_num_params](nn::Module&, const std::string&, std::int64_t unwrapped) { return unwrapped >= min_num_params; };
}

FullyShardedDataParallel::FullyShardedDataParallel(nn::Module& module, collectives::Communicator& comm,
                                                   const OptimizerFactory& factory, FsdpOptions options)
    : module_(module), comm_(comm), options_(std::move(options)) {
  TROUPE_CHECK(factory != nullptr, "FullyShardedDataParallel: the optimizer factory is empty");
  TROUPE_CHECK(!options_.master_dtype || tensor::is_floating(*options_.master_dtype),
               "FullyShardedDataParallel: master_dtype must be floating, got ", *options_.master_dtype);
  TROUPE_CHECK(!options_.device.is_meta(), "FullyShardedDataParallel: options.device is where a meta module is ",
               "materialised; it cannot be the meta device itself");
  const std::vector<std::string> paths = choose_unit_paths();
  // A meta module's values are computed from their descriptions, the same on every
  // rank, so they are not broadcast; its (small) buffers are materialised whole.
  for (const auto& [name, buffer] : module_.named_buffers())
    if (tensor::is_meta(*buffer)) *buffer = buffer->to(options_.device);
  if (options_.broadcast_from_rank0 && comm_.size() > 1) {
    for (const auto& [name, param] : module_.named_parameters())
      if (!tensor::is_meta(param->data)) comm_.broadcast(collectives::Buffer(param->data), 0);
    for (const auto& [name, buffer] : module_.named_buffers())
      if (buffer->defined() && buffer->numel() > 0) comm_.broadcast(collectives::Buffer(*buffer), 0);
  }
  if (options_.cpu_offload) {  // pinned for a GPU's DMA when the model computes there
    tensor::Device compute = options_.device;
    for (const auto& [name, param] : module_.named_parameters())
      if (!tensor::is_meta(param->data)) {
        compute = param->data.device();
        break;
      }
    pool_ = std::make_shared<OffloadMemory>(compute);
  }
  state_keys_ = module_.state_dict().keys();
  for (const auto& [name, buffer] : module_.named_buffers()) buffers_[name] = buffer;
  const auto aliases = shared_parameter_names();
  build_units(paths);
  for (const auto& [alias, name] : aliases) {  // state dicts list them; the optimizer does not
    flat_of_[alias] = flat_of_.at(name);
    entry_of_[alias] = entry_of_.at(name);
    aliases_.insert(alias);
  }
  build_leaves();
  std::vector<nn::NamedParameter> shards;
  for (auto& unit : units_)
    for (auto& flat : unit.flats) shards.push_back({flat.name, flat.shard.get()});
  optimizer_ = factory(std::move(shards));
  TROUPE_CHECK(optimizer_ != nullptr, "FullyShardedDataParallel: the optimizer factory returned null");
  gathered_at_step_ = optimizer_->step_count();
  if (pool_)
    optimizer_->set_state_allocator(
        [pool = pool_](const tensor::Shape& shape, tensor::DType dtype) { return pool->empty(shape, dtype); });
}

// A shared parameter's other names (GPT's lm_head.weight is transformer.wte.weight):
// state-dict keys that are neither a buffer nor a name of named_parameters(), each with
// the name of the parameter whose tensor it is.
std::vector<std::pair<std::string, std::string>> FullyShardedDataParallel::shared_parameter_names() {
  const auto named = module_.named_parameters();
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, value] : module_.state_dict()) {
    if (buffers_.contains(key)) continue;
    if (std::any_of(named.begin(), named.end(), [&](const nn::NamedParameter& n) { return n.name == key; })) continue;
    for (const auto& n : named)
      if (n.param->data.shares_storage_with(value) && n.param->data.offset() == value.offset() &&
          n.param->data.shape() == value.shape())
        out.emplace_back(key, n.name);
  }
  return out;
}

// The manual paths (checked to exist) plus the policy's picks, deduplicated, sorted so
// an outer unit comes before the units nested in it.
std::vector<std::string> FullyShardedDataParallel::choose_unit_paths() {
  std::set<std::string> paths;
  for (const auto& path : options_.wrap) {
    TROUPE_CHECK(!path.empty(),
                 "FullyShardedDataParallel: wrap names the root module (\"\"); the root is always a unit");
    TROUPE_CHECK(find_module(module_, path) != nullptr, "FullyShardedDataParallel: wrap names '", path,
                 "', which is not a submodule of ", module_.type_name());
    paths.insert(path);
  }
  if (options_.auto_wrap_policy) {
    PolicyWalk walk{options_.auto_wrap_policy, {}, 0, 0};
    walk.visit(module_, "", true);
    if (walk.chosen.empty())
      TROUPE_THROW(InvalidArgument, "FullyShardedDataParallel: the auto_wrap_policy wrapped nothing in ",
                   module_.type_name(), " (", walk.considered, " submodules considered, the largest with ",
                   walk.largest, " parameters); without a unit the whole model is gathered at once. ",
                   "Check the module types or lower min_num_params");
    paths.insert(walk.chosen.begin(), walk.chosen.end());
  }
  return {paths.begin(), paths.end()};
}

// Every parameter goes to the innermost unit containing it (the root unit "" when none
// does); a unit's parameters are flattened in named order, one flat per dtype, padded to
// a multiple of W. Rank r copies elements [r*S, (r+1)*S) into its shard, then the
// module's own tensors are dropped.
void FullyShardedDataParallel::build_units(const std::vector<std::string>& paths) {
  const auto named = module_.named_parameters();
  std::vector<std::string> all = paths;
  all.insert(all.begin(), "");
  std::vector<std::size_t> owner(named.size());
  for (std::size_t i = 0; i < named.size(); ++i) {
    std::size_t best = 0;
    for (std::size_t u = 1; u < all.size(); ++u)
      if (inside(named[i].name, all[u]) && all[u].size() > all[best].size()) best = u;
    owner[i] = best;
  }
  const std::int64_t world = comm_.size(), me = comm_.rank();
  std::vector<std::size_t> unit_of_path(all.size(), kNoUnit);
  // Units in the order of their first parameter, so flats follow the model's order.
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (unit_of_path[owner[i]] == kNoUnit) {
      unit_of_path[owner[i]] = units_.size();
      units_.push_back(Unit{all[owner[i]], {}, UnitState::sharded, {}, {}});
    }
    Unit& unit = units_[unit_of_path[owner[i]]];
    const Tensor& data = named[i].param->data;
    const tensor::Device device = tensor::is_meta(data) ? options_.device : data.device();
    auto flat = std::find_if(unit.flats.begin(), unit.flats.end(),
                             [&](const Flat& f) { return f.dtype == data.dtype() && f.device == device; });
    if (flat == unit.flats.end()) {
      unit.flats.emplace_back();
      flat = unit.flats.end() - 1;
      flat->dtype = data.dtype();
      flat->device = device;
    }
    flat->entries.push_back(Entry{named[i].param, named[i].name, data.shape(), flat->numel, data.numel()});
    flat->numel += data.numel();
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (keeps_parameters()) unit.state = UnitState::gathered;
    for (std::size_t f = 0; f < unit.flats.size(); ++f) {
      Flat& flat = unit.flats[f];
      flat.name = "_fsdp.";
      flat.name += unit.path.empty() ? std::string("root") : unit.path;
      flat.name += ".flat_param";
      if (unit.flats.size() > 1) flat.name.append(".").append(tensor::dtype_name(flat.dtype));
      flat.shard_numel = (flat.numel + world - 1) / world;
      flat.padded = flat.shard_numel * world;
      const tensor::DType master =
          options_.master_dtype && tensor::is_floating(flat.dtype) ? *options_.master_dtype : flat.dtype;
      const std::int64_t lo = me * flat.shard_numel, hi = lo + flat.shard_numel;
      if (keeps_parameters()) {
        // shard_grad_op: the full parameters stay, in the flat buffer the module's
        // tensors now view; the shard is this rank's block of it when it can be.
        flat.full = Tensor::zeros({flat.padded}, flat.dtype, flat.device);
        note_bytes(static_cast<std::ptrdiff_t>(flat.full.nbytes()));
        for (auto& entry : flat.entries) {
          Tensor view = flat.full.slice(entry.offset, entry.offset + entry.numel);
          if (tensor::is_meta(entry.param->data))
            tensor::materialize_into(view, entry.param->data, 0);
          else
            view.copy_(entry.param->data.flatten());
          entry.param->data = view.reshape(entry.shape);
        }
      }
      Tensor shard;
      if (keeps_parameters() && !pool_ && master == flat.dtype) {
        shard = flat.full.slice(lo, hi);
      } else {
        shard =
            pool_ ? pool_->zeros({flat.shard_numel}, master) : Tensor::zeros({flat.shard_numel}, master, flat.device);
        for (const auto& entry : flat.entries) {
          const std::int64_t a = std::max(lo, entry.offset), b = std::min(hi, entry.offset + entry.numel);
          if (a >= b) continue;
          if (tensor::is_meta(entry.param->data))  // only this rank's elements are ever computed
            tensor::materialize_into(shard.slice(a - lo, b - lo), entry.param->data, a - entry.offset);
          else
            shard.slice(a - lo, b - lo).copy_(entry.param->data.flatten().slice(a - entry.offset, b - entry.offset));
        }
      }
      for (std::size_t e = 0; e < flat.entries.size(); ++e) {
        Entry& entry = flat.entries[e];
        flat_of_[entry.name] = {u, f};
        entry_of_[entry.name] = e;
        if (!keeps_parameters()) entry.param->data = Tensor();
        entry.param->grad = Tensor();
      }
      flat.shard = std::make_unique<nn::Parameter>(nn::Parameter{std::move(shard), Tensor()});
      for (const auto& entry : flat.entries) {  // for per-parameter optimizer options
        const std::int64_t a = std::max(lo, entry.offset), b = std::min(hi, entry.offset + entry.numel);
        if (a < b) flat.shard->segments.push_back({entry.name, entry.shape, a - lo, b - lo});
      }
    }
  }
}

// The leaves are the non-Sequential modules reached from the root through Sequentials,
// in execution order; each belongs to the unit of its parameters (none: no parameters).
void FullyShardedDataParallel::build_leaves() {
  std::function<void(nn::Module&, const std::string&)> walk = [&](nn::Module& m, const std::string& path) {
    if (auto* seq = dynamic_cast<nn::Sequential*>(&m)) {
      for (std::size_t i = 0; i < seq->size(); ++i) walk((*seq)[i], join(path, std::to_string(i)));
    } else {
      leaves_.push_back(Leaf{&m, path, kNoUnit});
    }
  };
  walk(module_, "");
  first_leaf_.assign(units_.size(), kNoUnit);
  last_leaf_.assign(units_.size(), 0);
  for (std::size_t l = 0; l < leaves_.size(); ++l) {
    Leaf& leaf = leaves_[l];
    for (const auto& [name, where] : flat_of_) {
      if (!inside(name, leaf.path)) continue;
      if (leaf.unit != kNoUnit && leaf.unit != where.first) {  // a unit inside a leaf: the leaf runs its units itself
        leaves_.clear();
        install_hooks();
        return;
      }
      leaf.unit = where.first;
    }
    if (leaf.unit == kNoUnit) continue;
    if (first_leaf_[leaf.unit] == kNoUnit) {
      first_leaf_[leaf.unit] = l;
      forward_order_.push_back(leaf.unit);
    }
    last_leaf_[leaf.unit] = l;
  }
  for (std::size_t l = leaves_.size(); l-- > 0;) {
    const std::size_t u = leaves_[l].unit;
    if (u != kNoUnit && std::find(backward_order_.begin(), backward_order_.end(), u) == backward_order_.end())
      backward_order_.push_back(u);
  }
}

}  // namespace troupe::parallel

namespace troupe::parallel {

// A model whose units lie inside a module that runs them itself (a GPT's blocks): the
// root runs whole, and hooks on each unit's module gather it just before it runs and
// release it after, as PyTorch's FSDP does with module hooks. The root unit stays
// gathered from the start of forward (backward) to its end. Units are used in the
// order of their parameters (the model's order); prefetch follows that order.
void FullyShardedDataParallel::install_hooks() {
  forward_order_.clear();
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (units_[u].path.empty()) root_unit_ = u;
  if (root_unit_ != kNoUnit) forward_order_.push_back(root_unit_);
  for (std::size_t u = 0; u < units_.size(); ++u)
    if (u != root_unit_) forward_order_.push_back(u);
  backward_order_ = forward_order_;
  std::reverse(backward_order_.begin() + (root_unit_ != kNoUnit ? 1 : 0), backward_order_.end());
  const bool post = options_.backward_prefetch == FsdpOptions::BackwardPrefetch::backward_post;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (u == root_unit_) continue;
    nn::Module* module = find_module(module_, units_[u].path);
    auto hooks = std::make_shared<nn::ModuleHooks>();
    hooks->before_forward = [this, u] { ensure_gathered(u, forward_order_, options_.prefetch); };
    hooks->after_forward = [this, u] { release_parameters(u); };
    hooks->before_backward = [this, u, post] {
      ensure_gathered(u, backward_order_, options_.prefetch && !post);
      bind_gradients(u);
    };
    hooks->after_backward = [this, u, post] { after_unit_backward(u, post); };
    module->set_hooks(std::move(hooks));
    hooked_.push_back(module);
  }
}

}  // namespace troupe::parallel
