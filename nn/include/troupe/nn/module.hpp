// Module: the base of every layer, with an explicit forward and backward.
//
// There is no autograd tape. A layer's forward caches what its backward needs, and
// backward(grad_output) returns the gradient with respect to the forward's input
// while ADDING the gradients of the layer's parameters into Parameter::grad (see
// parameter.hpp for why a defined grad is never replaced). The contract per step is
// forward, then backward with the gradient of that forward's output, as in llm.c;
// a second backward after one forward adds the same gradients again.
//
// Names follow PyTorch. A module registers its parameters, buffers and children in
// its constructor; a parameter's full name is the path of child names from the
// root, dot-joined ("layers.0.weight"). named_parameters(), named_buffers() and
// state_dict() list a module's own entries, then each child's, in registration
// order -- the order torch.nn.Module uses, so checkpoints line up name for name.
//
// Grad-ready hook: set_grad_ready_hook() on the root installs one callback on every
// submodule, with each module's name prefix. A layer calls it for each parameter the
// moment that parameter's gradient is final in the current backward, so the hook
// fires in the order gradients become final: reverse layer order in a Sequential,
// and within our layers bias before weight, i.e. exactly the reverse of
// named_parameters(). DDP launches a bucket's all-reduce from here, overlapping
// communication with the rest of the backward. Set the hook after the model is
// built; children registered later inherit it from their parent.
//
// Shared parameters: register_shared_parameter() lists another module's parameter
// under a name of this one (GPT's lm_head.weight is transformer.wte.weight). It is
// one Parameter: each use adds into its one gradient, named_parameters() and
// parameter_count() count it once under its first name (what an optimizer and DDP
// see), and state_dict() lists it under every name, as torch.nn.Module does.
//
// Activation checkpointing (torch.utils.checkpoint; Megatron's full recompute):
// set_activation_checkpointing(true) on a module makes its training-mode forward keep
// only its input and free what its layers cached; its backward first runs the forward
// again from that input, with every Dropout's generator wound back, so the recomputed
// masks, the gradients and the generators' final state are bit for bit those of a run
// without it; the recomputed caches go when that backward ends, so a second backward
// needs a new forward. Hooks of modules below it fire again in the recompute (FSDP gathers a
// unit's parameters twice, as PyTorch's FSDP does under checkpointing). A forward must
// not change its input in place, the same rule the layers' caches rely on. The recompute
// runs forward_for_backward, which skips what no backward reads: GPT's Block does not
// compute its output (the next block keeps it as its input), so its MLP's last Linear,
// some 30% of the block's multiply-adds, is not run again.
//
// Several forwards in flight: a layer caches one forward, so a caller that runs more
// forwards before their backwards (a pipeline's micro-batches) takes each forward's
// caches out of the tree with take_activations() and puts them back before its backward
// (restore_activations): the backward then reads what that forward cached, as PyTorch's
// autograd graph per micro-batch does. A checkpointed module's kept input and generator
// states travel the same way, so its recompute still runs in its own backward.
//
// Deferred weight gradients (zero-bubble pipelines): defer_weight_gradients(queue) on a
// module makes every Linear at or below it queue its weight's gradient product instead
// of computing it in backward; see weight_gradients.hpp.
//
// Modules are neither copyable nor movable: optimizers and DDP hold parameters by
// address, so parameters must stay where they were created.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/nn/parameter.hpp"
#include "troupe/nn/state_dict.hpp"
#include "troupe/nn/weight_gradients.hpp"
#include "troupe/tensor/device.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn {

using tensor::Device;
using tensor::DType;

using GradReadyHook = std::function<void(const std::string& name, Parameter& param)>;

class Module;

// What forwards cached for their backwards, taken out of a module tree
// (Module::take_activations) and put back (restore_activations) in the same order.
// A layer lists each field its backward reads in exchange_own_activations; a field is
// moved out (left at its default, as release does) or moved back in, by direction.
class ActivationStash {
 public:
  template <class T>
  void exchange(T& field) {
    if (restoring_) {
      field = std::any_cast<T>(std::move(slots_.at(next_++)));
      return;
    }
    if (!discarding_) slots_.emplace_back(std::move(field));
    field = T{};
  }

 private:
  friend class Module;
  std::vector<std::any> slots_;
  std::size_t next_ = 0;
  bool restoring_ = false;
  bool discarding_ = false;  // release_activations: the fields are only reset
};

struct ModuleHooks {
  std::function<void()> before_forward, after_forward, before_backward, after_backward;
};

struct NamedModule {
  std::string name;
  Module* module = nullptr;
};

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // Runs forward_impl between the hooks a wrapper installed (set_hooks). Parents call
  // their children through forward/backward, so hooks fire at any depth.
  Tensor forward(const Tensor& input);
  // Returns the gradient with respect to forward's input (undefined when the input
  // has no gradient, e.g. Embedding's indices) and accumulates parameter gradients.
  Tensor backward(const Tensor& grad_output);
  // What a checkpointed ancestor's recompute runs in place of forward: caches what
  // backward reads, and returns a tensor of the output's shape, dtype and device whose
  // values a layer may leave unset where its own backward does not read them (Linear
  // skips x W^T; Dropout only draws its mask). Such a result may go on only to layers
  // whose backward needs no input values (Dropout), or be dropped. Hooks fire as in forward.
  Tensor forward_for_backward(const Tensor& input);
  // "Linear(4 -> 8)", "Sequential": names the module in error messages.
  virtual std::string type_name() const = 0;

  // Recursive, in registration order, with full names.
  std::vector<NamedParameter> named_parameters();
  std::vector<Parameter*> parameters();
  std::vector<NamedBuffer> named_buffers();
  // Direct children only.
  std::vector<NamedModule> named_children();
  // Total number of parameter elements, recursively, a shared parameter once.
  std::int64_t parameter_count() const;

  // Parameters and buffers by full name. The values share storage with the module.
  StateDict state_dict() const;
  // Copies values into the existing tensors, so views into flat buffers (and the
  // optimizer's pointers) stay valid. Everything is checked before anything is
  // copied: one error lists all missing keys, unexpected keys and shape/dtype
  // mismatches. strict=false tolerates missing and unexpected keys, never mismatches.
  void load_state_dict(const StateDict& dict, bool strict = true);

  // Training mode, recursively (Dropout is the identity in eval mode).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // set_to_none=true drops every grad; false zero-fills the defined ones in place
  // (keeping bucket views) and leaves undefined ones undefined, as PyTorch does.
  void zero_grad(bool set_to_none = true);

  // Installs `hook` on this module and every submodule (an empty function removes it).
  void set_grad_ready_hook(GradReadyHook hook);

  // See "Deferred weight gradients" above: `queue` (null: none, the default) for this
  // module and every submodule, children registered later included. It must outlive
  // the backwards that defer into it.
  void defer_weight_gradients(WeightGradients* queue);

  // Calls around this module's forward and backward (null removes them): how FSDP
  // gathers a unit's parameters just before a module of any tree runs, as PyTorch's
  // forward pre-hooks do. One set per module, not inherited by children.
  void set_hooks(std::shared_ptr<const ModuleHooks> hooks) { hooks_ = std::move(hooks); }

  // See "Activation checkpointing" above. Eval-mode forwards keep their caches as usual.
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }
  // Drops what the last forward cached, here and below: a backward must follow a new
  // forward. Checkpointing calls it; so may a caller that ran forward for its output only.
  void release_activations();
  // What the last forward cached here and below (a checkpointed module's input and
  // generator states included), taken out, and put back before that forward's backward:
  // see "Several forwards in flight" above. A recompute leaves the generators where the
  // later forwards left them.
  ActivationStash take_activations();
  void restore_activations(ActivationStash stash);

  // A direct child by name, shared (null when there is none): for a module that runs
  // part of another's tree, as a pipeline stage runs some of a model's blocks.
  std::shared_ptr<Module> shared_child(std::string_view name) const;
  // The direct children's names, in registration order.
  std::vector<std::string> child_names() const;

  // Converts every parameter and buffer to `dtype` (e.g. f64 for finite-difference
  // checks). Gradients are dropped and views are not preserved: call it while
  // building the model, before an optimizer or DDP holds on to anything.
  void to(DType dtype);
  // Moves every parameter and buffer to `device` (model.to("cuda") in PyTorch), with
  // the same rules: gradients are dropped, so call it before an optimizer or DDP.
  void to(Device device);

 protected:
  // What a layer computes; see forward() and backward() above.
  virtual Tensor forward_impl(const Tensor& input) = 0;
  virtual Tensor backward_impl(const Tensor& grad_output) = 0;
  // See forward_for_backward(); by default forward_impl, values and all.
  virtual Tensor forward_for_backward_impl(const Tensor& input) { return forward_impl(input); }

  // Names are non-empty, without '.', and unique among a module's parameters,
  // buffers and children. The returned reference stays valid for the module's life.
  Parameter& register_parameter(std::string name, Tensor data);
  // `shared` must outlive this module (usually: it belongs to a sibling under the
  // same root).
  Parameter& register_shared_parameter(std::string name, Parameter& shared);
  Tensor& register_buffer(std::string name, Tensor value);
  Module& register_module(std::string name, std::shared_ptr<Module> child);
  // The same, returning the child as its own type.
  template <class M>
  M& register_module(std::string name, std::shared_ptr<M> child) {
    M& ref = *child;
    register_module(std::move(name), std::shared_ptr<Module>(std::move(child)));
    return ref;
  }

  // Each field this layer alone cached for its backward, passed to stash.exchange in a
  // fixed order (children are the base's business): how caches are released, and
  // taken out and put back.
  virtual void exchange_own_activations(ActivationStash& /*stash*/) {}
  // The generator this layer's forward draws from (Dropout's), wound back before a
  // checkpointed forward is recomputed; null for a deterministic layer.
  virtual tensor::Generator* forward_generator() { return nullptr; }

  // A layer's backward calls this once its own use of `param` is done; the hook fires
  // when every module that registered it has called.
  void grad_ready(Parameter& param);
  // Where this layer's backward queues its weight-gradient products, or null: compute them.
  WeightGradients* deferred_weight_gradients() const { return deferred_; }

 private:
  using SharedHook = std::shared_ptr<const GradReadyHook>;
  void check_new_name(const std::string& name) const;
  void install_hook(const SharedHook& hook, const std::string& prefix);
  void collect_parameters(const std::string& prefix, std::vector<NamedParameter>& out) const;
  void collect_buffers(const std::string& prefix, std::vector<NamedBuffer>& out);
  void collect_state(const std::string& prefix, StateDict& out) const;
  void collect_generators(std::vector<tensor::Generator*>& out);
  Tensor checkpointed_forward(const Tensor& input);
  void exchange_activations(ActivationStash& stash);
  bool recompute_forward();

  // Own and shared parameters by name; the own ones live in owned_, behind
  // unique_ptr so that addresses survive later registrations.
  std::vector<std::pair<std::string, Parameter*>> parameters_;
  std::vector<std::unique_ptr<Parameter>> owned_;
  std::vector<std::pair<std::string, std::unique_ptr<Tensor>>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::shared_ptr<const ModuleHooks> hooks_;
  SharedHook hook_;
  std::string hook_prefix_;
  WeightGradients* deferred_ = nullptr;
  // Activation checkpointing: the forward's input and each generator's state before it.
  bool checkpointing_ = false;
  bool recompute_pending_ = false;
  Tensor checkpoint_input_;
  std::vector<tensor::Generator> checkpoint_generators_;
};

// FNV-1a over every parameter's bytes, in named order: equal on two ranks (or two runs)
// exactly when their parameters are bit-identical.
std::uint64_t parameter_hash(Module& model);

}  // namespace troupe::nn
