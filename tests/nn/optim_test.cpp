// Optimizers against values computed by hand (in double, outside troupe) from
// PyTorch's documented update rules, three steps each, and their state dicts.
//
// Every case starts from p = [1, -2, 0.5] and applies the gradients
// [0.1, -0.2, 0.3], [-0.4, 0.5, 0.6], [0.7, -0.8, -0.9] in turn.
#include <gtest/gtest.h>

#include "troupe/nn/adam.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;
using namespace troupe::nn;

namespace {

const std::vector<std::vector<double>> kGrads = {{0.1, -0.2, 0.3}, {-0.4, 0.5, 0.6}, {0.7, -0.8, -0.9}};

Parameter start(DType dtype = DType::f64) {
  return {Tensor::from_vector<double>({1.0, -2.0, 0.5}).to(dtype), Tensor()};
}

void run_three_steps(Optimizer& opt, Parameter& p) {
  for (const auto& g : kGrads) {
    p.grad = Tensor::from_vector(g).to(p.data.dtype());
    opt.step();
  }
}

void expect_values(const Parameter& p, const std::vector<double>& want, double tol = 1e-14) {
  const auto got = p.data.to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace

TEST(SGD, PlainStepsAreMinusLrTimesGrad) {
  Parameter p = start();
  SGD opt({{"p", &p}}, 0.1);
  run_three_steps(opt, p);
  expect_values(p, {0.9600000000000001, -1.9499999999999997, 0.5});
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(SGD, MomentumBufferStartsAtTheFirstGradient) {
  Parameter p = start();
  SGD opt({{"p", &p}}, 0.1, 0.9);
  run_three_steps(opt, p);
  expect_values(p, {0.9788999999999999, -1.9608, 0.39469999999999994});
}

TEST(SGD, DampeningScalesNewGradientsAfterTheFirstStep) {
  Parameter p = start();
  SGD opt({{"p", &p}}, 0.1, 0.9, 0.5);
  run_three_steps(opt, p);
  expect_values(p, {0.9758999999999999, -1.9532999999999998, 0.40669999999999995});
}

TEST(SGD, NesterovLooksAheadAlongTheMomentum) {
  Parameter p = start();
  SGD opt({{"p", &p}}, 0.1, 0.9, 0.0, 0.0, true);
  run_three_steps(opt, p);
  expect_values(p, {0.9410099999999999, -1.91472, 0.40523});
}

TEST(SGD, WeightDecayAddsToTheGradient) {
  Parameter p = start();
  SGD opt({{"p", &p}}, 0.1, 0.0, 0.0, 0.01);
  run_three_steps(opt, p);
  expect_values(p, {0.956982989, -1.9439959779999998, 0.4986214695});
}

TEST(SGD, WeightDecayWithNesterovMomentum) {
  Parameter p = start();
  SGD opt({{"p", &p}}, 0.1, 0.9, 0.0, 0.01, true);
  run_three_steps(opt, p);
  expect_values(p, {0.9329334125509999, -1.898675125102, 0.40173778480050004});
}

TEST(SGD, RejectsNesterovWithoutMomentumOrWithDampening) {
  Parameter p = start();
  EXPECT_THROW(SGD({{"p", &p}}, 0.1, 0.0, 0.0, 0.0, true), InvalidArgument);
  EXPECT_THROW(SGD({{"p", &p}}, 0.1, 0.9, 0.1, 0.0, true), InvalidArgument);
  EXPECT_THROW(SGD({{"p", &p}}, -0.1), InvalidArgument);
  EXPECT_THROW(SGD({{"p", &p}, {"p", &p}}, 0.1), InvalidArgument);
}

TEST(Adam, ThreeStepsMatchTheBiasCorrectedUpdate) {
  Parameter p = start();
  Adam opt({{"p", &p}}, 0.1);
  run_three_steps(opt, p);
  expect_values(p, {0.9228415530469758, -1.9102996677878106, 0.3101417042408007});
}

TEST(Adam, WeightDecayIsAddedToTheGradient) {
  Parameter p = start();
  Adam opt({{"p", &p}}, 0.1, {0.9, 0.999}, 1e-8, 0.1);
  run_three_steps(opt, p);
  expect_values(p, {0.876853785630137, -1.8331765222043503, 0.3031428306570541});
}

TEST(AdamW, DecaysTheParameterBeforeTheAdamUpdate) {
  Parameter p = start();
  AdamW opt({{"p", &p}}, 0.1, {0.9, 0.999}, 1e-8, 0.1);
  EXPECT_EQ(opt.type_name(), "AdamW");
  run_three_steps(opt, p);
  expect_values(p, {0.8945710493731245, -1.8524454524361382, 0.2982463861799443});
}

TEST(AdamW, F32ParametersStayF32AndAgreeToSinglePrecision) {
  Parameter p = start(DType::f32);
  AdamW opt({{"p", &p}}, 0.1, {0.9, 0.999}, 1e-8, 0.1);
  run_three_steps(opt, p);
  EXPECT_EQ(p.data.dtype(), DType::f32);
  expect_values(p, {0.8945710493731245, -1.8524454524361382, 0.2982463861799443}, 1e-6);
}

// A flat shard packing part of a matrix, a bias and one padding element: the filter
// is asked per packed parameter, so the matrix's part decays and the bias does not,
// each exactly as if it were stepped on its own.
TEST(AdamW, DecayFilterAppliesToTheParametersAFlatShardPacks) {
  Parameter flat{Tensor::from_vector<double>({1.0, -2.0, 0.5, 1.0, -2.0, 0.5, 0.0}), Tensor()};
  flat.segments = {{"w", {3, 2}, 0, 3}, {"b", {3}, 3, 6}};
  AdamW opt({{"_fsdp.root.flat_param", &flat}}, 0.1, {0.9, 0.999}, 1e-8, 0.1);
  opt.set_weight_decay_filter(decay_matrices_only);
  Parameter bias = start();
  AdamW plain({{"b", &bias}}, 0.1, {0.9, 0.999}, 1e-8, 0.0);
  for (const auto& g : kGrads) {
    flat.grad = Tensor::from_vector<double>({g[0], g[1], g[2], g[0], g[1], g[2], 0.0});
    bias.grad = Tensor::from_vector(g);
    opt.step();
    plain.step();
  }
  const auto got = flat.data.to_vector<double>();
  const std::vector<double> decayed = {0.8945710493731245, -1.8524454524361382, 0.2982463861799443};
  const auto undecayed = bias.data.to_vector<double>();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(got[i], decayed[i], 1e-14) << "matrix element " << i;
    EXPECT_EQ(got[3 + i], undecayed[i]) << "bias element " << i;
  }
  EXPECT_EQ(got[6], 0.0);                                   // padding
  flat.segments = {{"b", {3}, 3, 6}, {"w", {3, 2}, 0, 3}};  // out of order: refused, naming both
  flat.grad = Tensor::zeros({7}, DType::f64);
  try {
    opt.step();
    ADD_FAILURE() << "segments out of order were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("segment 'w' [0, 3)"), std::string::npos) << e.what();
  }
}

TEST(Optimizer, SkipsParametersWithoutAGradAndKeepsTheirAdamStepCount) {
  Parameter a = start(), b = start();
  Adam opt({{"a", &a}, {"b", &b}}, 0.1);
  a.grad = Tensor::from_vector(kGrads[0]);
  opt.step();  // b has no grad: untouched, no state
  expect_values(b, {1.0, -2.0, 0.5}, 0);
  EXPECT_FALSE(opt.state_dict().contains("b/exp_avg"));
  // b's first update is its own step 1, as in PyTorch: same result as a fresh Adam.
  a.grad = Tensor();
  run_three_steps(opt, b);
  expect_values(b, {0.9228415530469758, -1.9102996677878106, 0.3101417042408007});
  EXPECT_EQ(opt.state_dict().at("b/step").item(), 3);
  EXPECT_EQ(opt.state_dict().at("a/step").item(), 1);
}

TEST(Optimizer, LrCanBeSetAndZeroGradClearsGrads) {
  Parameter p = start();
  SGD opt({{"p", &p}}, 0.1);
  opt.set_lr(0.5);
  EXPECT_EQ(opt.lr(), 0.5);
  EXPECT_THROW(opt.set_lr(-1), InvalidArgument);
  p.grad = Tensor::ones({3}, DType::f64);
  opt.zero_grad(false);
  EXPECT_EQ(tensor::sum(p.grad).item(), 0.0);
  opt.zero_grad();
  EXPECT_FALSE(p.grad.defined());
}

TEST(Optimizer, StateDictRoundTripResumesExactly) {
  Parameter a = start(), resumed = start();
  Adam first({{"p", &a}}, 0.1, {0.8, 0.99}, 1e-6, 0.01);
  a.grad = Tensor::from_vector(kGrads[0]);
  first.step();
  a.grad = Tensor::from_vector(kGrads[1]);
  first.step();
  const StateDict saved = first.state_dict();
  EXPECT_EQ(saved.keys(), (std::vector<std::string>{"lr", "step", "betas.0", "betas.1", "eps", "weight_decay", "p/step",
                                                    "p/exp_avg", "p/exp_avg_sq"}));

  Adam second({{"p", &resumed}}, 0.5);  // different hyper-parameters: the dict wins
  resumed.data.copy_(a.data);
  second.load_state_dict(saved);
  EXPECT_EQ(second.lr(), 0.1);
  EXPECT_EQ(second.betas().beta1, 0.8);
  EXPECT_EQ(second.step_count(), 2);
  a.grad = Tensor::from_vector(kGrads[2]);
  resumed.grad = Tensor::from_vector(kGrads[2]);
  first.step();
  second.step();
  EXPECT_TRUE(tensor::equal(a.data, resumed.data));
}

TEST(Optimizer, SgdMomentumBufferIsSavedUnderTheParameterName) {
  Parameter p = start();
  SGD opt({{"fc.weight", &p}}, 0.1, 0.9);
  p.grad = Tensor::from_vector(kGrads[0]);
  opt.step();
  const StateDict dict = opt.state_dict();
  EXPECT_TRUE(tensor::equal(dict.at("fc.weight/momentum_buffer"), Tensor::from_vector(kGrads[0])));
  EXPECT_EQ(dict.at("nesterov").item(), 0.0);
}

TEST(Optimizer, LoadStateDictReportsEveryProblemInOneError) {
  Parameter p = start();
  Adam opt({{"p", &p}}, 0.1);
  StateDict bad;
  bad.insert("lr", Tensor::full({}, 0.1, DType::f64));
  bad.insert("betas.0", Tensor::full({}, 0.9, DType::f64));
  bad.insert("p/exp_avg", Tensor::zeros({4}, DType::f64));
  bad.insert("q/exp_avg", Tensor::zeros({3}, DType::f64));
  bad.insert("momentum", Tensor::full({}, 0.9, DType::f64));
  try {
    opt.load_state_dict(bad);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const char* part :
         {"missing 'step'", "missing 'betas.1'", "unexpected key 'q/exp_avg'", "unexpected key 'momentum'",
          "'p/exp_avg' is f64 [4], expected f64 [3]", "incomplete state for 'p'"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing \"" << part << "\" in: " << msg;
  }
  EXPECT_EQ(opt.step_count(), 0);
}
