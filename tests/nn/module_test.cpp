// Module: names, state dicts, training mode, gradient accumulation and the
// grad-ready hook.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "troupe/nn/activation.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/layer_norm.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::nn;
using tensor::Generator;

namespace {

// A module with a child, like a transformer block holding an MLP: parameter names
// nest ("mlp.0.weight").
class Block : public Module {
 public:
  explicit Block(Generator& gen) {
    norm_ = register_module_as<LayerNorm>("norm", 4);
    auto mlp = std::make_shared<Sequential>();
    mlp->emplace<Linear>(4, 8, gen);
    mlp->emplace<ReLU>();
    mlp->emplace<Linear>(8, 4, gen);
    mlp_ = mlp.get();
    register_module("mlp", mlp);
    scale_ = &register_buffer("scale", Tensor::full({1}, 2.0));
  }
  Tensor forward_impl(const Tensor& x) override { return mlp_->forward(norm_->forward(x)); }
  Tensor backward_impl(const Tensor& g) override { return norm_->backward(mlp_->backward(g)); }
  std::string type_name() const override { return "Block"; }
  Tensor& scale() { return *scale_; }

 private:
  template <class M, class... Args>
  M* register_module_as(std::string name, Args&&... args) {
    auto m = std::make_shared<M>(std::forward<Args>(args)...);
    register_module(std::move(name), m);
    return m.get();
  }
  LayerNorm* norm_;
  Sequential* mlp_;
  Tensor* scale_;
};

std::vector<std::string> names_of(Module& m) {
  std::vector<std::string> out;
  for (auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

// 3 -> 5 -> 2 (modules are not movable, so the caller owns the Sequential).
void build_mlp(Sequential& model, Generator& gen) {
  model.emplace<Linear>(3, 5, gen);
  model.emplace<GELU>();
  model.emplace<Linear>(5, 2, gen);
}

}  // namespace

TEST(Module, NamedParametersUsePyTorchNamesInRegistrationOrder) {
  Generator gen(1);
  Block block(gen);
  EXPECT_EQ(names_of(block), (std::vector<std::string>{"norm.weight", "norm.bias", "mlp.0.weight", "mlp.0.bias",
                                                       "mlp.2.weight", "mlp.2.bias"}));
  EXPECT_EQ(block.parameter_count(), 4 + 4 + 32 + 8 + 32 + 4);
  EXPECT_EQ(block.parameters().size(), 6u);
  const auto buffers = block.named_buffers();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers[0].name, "scale");
}

TEST(Module, StateDictListsOwnParametersAndBuffersBeforeChildrensAndSharesStorage) {
  Generator gen(1);
  Block block(gen);
  const StateDict dict = block.state_dict();
  // Block's own buffer first, then each child's entries: torch.nn.Module's order.
  EXPECT_EQ(dict.keys(), (std::vector<std::string>{"scale", "norm.weight", "norm.bias", "mlp.0.weight", "mlp.0.bias",
                                                   "mlp.2.weight", "mlp.2.bias"}));
  EXPECT_TRUE(dict.at("mlp.0.weight").shares_storage_with(block.named_parameters()[2].param->data));
}

TEST(Module, StateDictRoundTripRestoresEveryValue) {
  Generator a(1), b(2);
  Block source(a), target(b);
  source.scale().fill_(5.0);
  ASSERT_FALSE(tensor::equal(source.state_dict().at("mlp.0.weight"), target.state_dict().at("mlp.0.weight")));
  target.load_state_dict(source.state_dict());
  const StateDict want = source.state_dict(), got = target.state_dict();
  for (const auto& [name, value] : want) EXPECT_TRUE(tensor::equal(value, got.at(name))) << name;
}

TEST(Module, LoadStateDictCopiesIntoTheExistingTensors) {
  Generator a(1), b(2);
  Sequential source, target;
  build_mlp(source, a);
  build_mlp(target, b);
  // Make a parameter a view into a flat buffer, as a flattened-parameter scheme would.
  Parameter& w = *target.named_parameters()[0].param;
  Tensor flat = Tensor::zeros({100});
  Tensor view = flat.slice(10, 10 + w.data.numel()).reshape(w.data.shape());
  view.copy_(w.data);
  w.data = view;
  target.load_state_dict(source.state_dict());
  EXPECT_TRUE(w.data.shares_storage_with(flat));
  EXPECT_TRUE(tensor::equal(flat.slice(10, 25).reshape({5, 3}), source.state_dict().at("0.weight")));
}

TEST(Module, StrictLoadListsAllMissingUnexpectedAndMismatchedKeysInOneError) {
  Generator gen(1);
  Sequential model;
  build_mlp(model, gen);
  StateDict dict;
  dict.insert("0.weight", Tensor::zeros({5, 3}));
  dict.insert("0.bias", Tensor::zeros({4}));                   // wrong shape
  dict.insert("2.weight", Tensor::zeros({2, 5}, DType::f64));  // wrong dtype
  dict.insert("fc.weight", Tensor::zeros({1}));
  dict.insert("2.running_mean", Tensor::zeros({1}));
  const Tensor before = model.state_dict().at("0.weight").clone();
  try {
    model.load_state_dict(dict);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const char* part : {"missing key(s): '2.bias'", "unexpected key(s): 'fc.weight', '2.running_mean'",
                             "'0.bias' is f32 [5] in the module but f32 [4] in the dict",
                             "'2.weight' is f32 [2, 5] in the module but f64 [2, 5] in the dict"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing \"" << part << "\" in: " << msg;
  }
  // Nothing was copied, not even the one key that matched.
  EXPECT_TRUE(tensor::equal(model.state_dict().at("0.weight"), before));
}

TEST(Module, NonStrictLoadSkipsMissingAndUnexpectedKeysButNotMismatches) {
  Generator gen(1);
  Sequential model;
  build_mlp(model, gen);
  StateDict dict;
  dict.insert("0.weight", Tensor::full({5, 3}, 0.5));
  dict.insert("extra", Tensor::zeros({1}));
  model.load_state_dict(dict, false);
  EXPECT_EQ(tensor::max(model.state_dict().at("0.weight")).item(), 0.5);
  dict.insert("2.bias", Tensor::zeros({3}));
  EXPECT_THROW(model.load_state_dict(dict, false), InvalidArgument);
}

TEST(Module, HookFiresOncePerParameterInReverseLayerOrder) {
  Generator gen(1);
  Sequential model;
  build_mlp(model, gen);
  std::vector<std::string> fired;
  model.set_grad_ready_hook([&](const std::string& name, Parameter& p) {
    EXPECT_TRUE(p.grad.defined()) << name;
    fired.push_back(name);
  });
  model.forward(Tensor::ones({4, 3}));
  model.backward(Tensor::ones({4, 2}));
  EXPECT_EQ(fired, (std::vector<std::string>{"2.bias", "2.weight", "0.bias", "0.weight"}));
  // Exactly the reverse of named_parameters(), which is what DDP's buckets assume.
  auto names = names_of(model);
  std::reverse(names.begin(), names.end());
  EXPECT_EQ(fired, names);
}

TEST(Module, HookUsesFullNamesInNestedModulesAndCanBeRemoved) {
  Generator gen(1);
  Block block(gen);
  std::vector<std::string> fired;
  block.set_grad_ready_hook([&](const std::string& name, Parameter&) { fired.push_back(name); });
  block.forward(Tensor::ones({2, 4}));
  block.backward(Tensor::ones({2, 4}));
  EXPECT_EQ(fired, (std::vector<std::string>{"mlp.2.bias", "mlp.2.weight", "mlp.0.bias", "mlp.0.weight", "norm.bias",
                                             "norm.weight"}));
  block.set_grad_ready_hook(nullptr);
  block.backward(Tensor::ones({2, 4}));
  EXPECT_EQ(fired.size(), 6u);
}

TEST(Module, GradientsAccumulateAcrossTwoBackwards) {
  Generator gen(1);
  Sequential model;
  build_mlp(model, gen);
  const Tensor x = Tensor::full({2, 3}, 0.3), gy = Tensor::full({2, 2}, 0.7);
  model.forward(x);
  model.backward(gy);
  std::vector<Tensor> once;
  for (auto* p : model.parameters()) once.push_back(p->grad.clone());
  model.forward(x);
  model.backward(gy);
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(tensor::allclose(params[i]->grad, tensor::mul(once[i], 2.0), 1e-6, 1e-7)) << i;
}

// A zero-bubble pipeline's split backward: the weights' products wait in the queue (the
// hook fires for them only when they run), the rest is done in backward, and after run()
// every gradient is the undeferred one, bit for bit, accumulated over two micro-batches.
TEST(Module, DeferredWeightGradientsRunLaterBitForBitAndFireTheHookThen) {
  Generator gen(1), same(1);
  Block plain(gen), deferring(same);
  const Tensor x0 = tensor::uniform({3, 4}, -1, 1, gen), x1 = tensor::uniform({3, 4}, -1, 1, gen);
  const Tensor g0 = tensor::uniform({3, 4}, -1, 1, gen), g1 = tensor::uniform({3, 4}, -1, 1, gen);
  std::vector<std::string> fired;
  deferring.set_grad_ready_hook([&](const std::string& name, Parameter&) { fired.push_back(name); });
  WeightGradients first, second;
  std::vector<Tensor> input_grads;
  for (const auto& [x, g, queue] : {std::tuple(x0, g0, &first), std::tuple(x1, g1, &second)}) {
    plain.forward(x);
    input_grads.push_back(plain.backward(g));
    deferring.forward(x);
    deferring.defer_weight_gradients(queue);
    EXPECT_EQ(deferring.backward(g).to_vector<float>(), input_grads.back().to_vector<float>());
    deferring.defer_weight_gradients(nullptr);
  }
  EXPECT_EQ(first.size(), 2u);
  EXPECT_FALSE(deferring.named_parameters()[2].param->grad.defined()) << "mlp.0.weight";
  EXPECT_EQ(fired, (std::vector<std::string>{"mlp.2.bias", "mlp.0.bias", "norm.bias", "norm.weight", "mlp.2.bias",
                                             "mlp.0.bias", "norm.bias", "norm.weight"}));
  fired.clear();
  first.run();
  second.run();
  EXPECT_TRUE(first.empty());
  EXPECT_EQ(fired, (std::vector<std::string>{"mlp.2.weight", "mlp.0.weight", "mlp.2.weight", "mlp.0.weight"}));
  const auto want = plain.named_parameters(), got = deferring.named_parameters();
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(got[i].param->grad.to_vector<float>(), want[i].param->grad.to_vector<float>()) << want[i].name;
}

TEST(Module, BackwardAddsIntoAGradThatIsAViewIntoABucket) {
  Generator gen(1);
  Sequential model;
  build_mlp(model, gen);
  // A DDP-style bucket holding every gradient, pre-filled with ones.
  Tensor bucket = Tensor::ones({model.parameter_count()});
  std::int64_t at = 0;
  for (auto* p : model.parameters()) {
    p->grad = bucket.slice(at, at + p->data.numel()).reshape(p->data.shape());
    at += p->data.numel();
  }
  model.forward(Tensor::full({2, 3}, 0.3));
  model.backward(Tensor::full({2, 2}, 0.7));
  Generator same_seed(1);
  Sequential reference;
  build_mlp(reference, same_seed);
  reference.forward(Tensor::full({2, 3}, 0.3));
  reference.backward(Tensor::full({2, 2}, 0.7));
  const auto params = model.parameters(), expected = reference.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i]->grad.shares_storage_with(bucket)) << i;
    EXPECT_TRUE(tensor::allclose(params[i]->grad, tensor::add(expected[i]->grad, 1.0), 1e-6, 1e-7)) << i;
  }
}

TEST(Module, ZeroGradEitherDropsGradsOrZeroFillsThemInPlace) {
  Generator gen(1);
  Sequential model;
  build_mlp(model, gen);
  model.forward(Tensor::ones({2, 3}));
  model.backward(Tensor::ones({2, 2}));
  Parameter& w = *model.parameters()[0];
  const Tensor grad = w.grad;
  model.zero_grad(false);
  EXPECT_TRUE(w.grad.shares_storage_with(grad));
  EXPECT_EQ(tensor::sum(tensor::abs(w.grad)).item(), 0.0);
  model.zero_grad();
  for (auto* p : model.parameters()) EXPECT_FALSE(p->grad.defined());
  model.zero_grad(false);  // undefined grads stay undefined
  EXPECT_FALSE(w.grad.defined());
}

TEST(Module, EvalDisablesDropoutInEveryChildAndTrainRestoresIt) {
  Sequential model;
  auto& dropout = model.emplace<Dropout>(0.5, 3);
  model.emplace<ReLU>();
  EXPECT_TRUE(dropout.is_training());
  model.eval();
  EXPECT_FALSE(model.is_training());
  EXPECT_FALSE(dropout.is_training());
  const Tensor x = Tensor::ones({100});
  EXPECT_TRUE(tensor::equal(model.forward(x), x));
  model.train();
  EXPECT_TRUE(dropout.is_training());
  EXPECT_FALSE(tensor::equal(model.forward(x), x));
}

TEST(Module, ToConvertsParametersAndBuffersAndDropsGrads) {
  Generator gen(1);
  Block block(gen);
  block.forward(Tensor::ones({1, 4}));
  block.backward(Tensor::ones({1, 4}));
  block.to(DType::f64);
  for (auto& [name, p] : block.named_parameters()) {
    EXPECT_EQ(p->data.dtype(), DType::f64) << name;
    EXPECT_FALSE(p->grad.defined()) << name;
  }
  EXPECT_EQ(block.scale().dtype(), DType::f64);
  EXPECT_EQ(block.forward(Tensor::ones({1, 4}, DType::f64)).dtype(), DType::f64);
}

TEST(Module, RejectsDuplicateAndDottedNames) {
  class Bad : public Module {
   public:
    explicit Bad(int which) {
      register_parameter("w", Tensor::zeros({1}));
      if (which == 0) register_parameter("w", Tensor::zeros({1}));
      if (which == 1) register_buffer("a.b", Tensor::zeros({1}));
    }
    Tensor forward_impl(const Tensor& x) override { return x; }
    Tensor backward_impl(const Tensor& g) override { return g; }
    std::string type_name() const override { return "Bad"; }
  };
  EXPECT_THROW(Bad(0), InvalidArgument);
  EXPECT_THROW(Bad(1), InvalidArgument);
  EXPECT_NO_THROW(Bad(2));
}

TEST(StateDict, KeepsInsertionOrderAndRejectsDuplicateKeys) {
  StateDict dict;
  dict.insert("b", Tensor::zeros({1}));
  dict.insert("a", Tensor::ones({2}));
  EXPECT_EQ(dict.keys(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(dict.size(), 2u);
  EXPECT_TRUE(dict.contains("a"));
  EXPECT_EQ(dict.find("c"), nullptr);
  EXPECT_THROW(dict.insert("a", Tensor::zeros({1})), InvalidArgument);
  dict.insert_or_assign("b", Tensor::ones({3}));
  EXPECT_EQ(dict.at("b").numel(), 3);
  EXPECT_EQ(dict.keys().front(), "b");
  try {
    dict.at("missing");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }
}
