// The troupe side of the PyTorch parity test (gpt_parity_test.py): a small GPT
// trained 20 AdamW steps on fixed batches, dropout off, f32 on the CPU. Everything the
// PyTorch side needs to repeat it, and everything it compares, goes into one HDF5 file:
//
//   /init/<name>          the initial state dict (every name, lm_head.weight too)
//   /batches/x, /y        [steps, B, T] i64 inputs and targets; /lrs [steps] f64
//   /block0/{x,r,y,dx}    block h.0 alone: input, upstream gradient, output, input gradient
//   /block0/grad/<name>   its parameters' gradients (from that one backward)
//   /step0/logits         the whole model's logits for batch 0
//   /step0/grad/<name>    every parameter's gradient after batch 0's backward, unclipped
//   /losses               [steps] f64, the loss of each step before its update
//   /final/<name>         the state dict after the last step
//
//   gpt_parity OUT.h5
#include <cstdio>
#include <string>
#include <vector>

#include "troupe/checkpoint/file_writer.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/lr_scheduler.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using tensor::DType;
using tensor::Tensor;

namespace {

constexpr std::int64_t kSteps = 20, kBatch = 4, kTime = 32;

Tensor random_ids(tensor::Generator& gen, std::int64_t vocab) {
  const Tensor u = tensor::uniform({kSteps, kBatch, kTime}, 0.0, static_cast<double>(vocab), gen, DType::f64);
  std::vector<std::int64_t> ids;
  for (double v : u.to_vector<double>()) ids.push_back(std::min<std::int64_t>(static_cast<std::int64_t>(v), vocab - 1));
  return Tensor::from_vector(ids, {kSteps, kBatch, kTime});
}

void write_state(checkpoint::FileWriter& out, const std::string& group, const nn::StateDict& state) {
  for (const auto& [name, t] : state) out.write_tensor(group + "/" + name, t);
}

void write_grads(checkpoint::FileWriter& out, const std::string& group, nn::Module& module) {
  for (const auto& [name, param] : module.named_parameters()) out.write_tensor(group + "/" + name, param->grad);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_parity OUT.h5\n");
    return 2;
  }
  tensor::set_num_threads(1);
  const nn::GPTConfig config{.block_size = kTime, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 64};
  nn::GPT model(config, 1234);
  checkpoint::FileWriter out(argv[1]);
  for (const auto& [key, value] : std::vector<std::pair<const char*, std::int64_t>>{{"block_size", config.block_size},
                                                                                    {"vocab_size", config.vocab_size},
                                                                                    {"n_layer", config.n_layer},
                                                                                    {"n_head", config.n_head},
                                                                                    {"n_embd", config.n_embd}})
    out.set_attribute("/", key, value);
  write_state(out, "/init", model.state_dict());

  tensor::Generator data(99);
  const Tensor xs = random_ids(data, config.vocab_size), ys = random_ids(data, config.vocab_size);
  out.write_tensor("/batches/x", xs);
  out.write_tensor("/batches/y", ys);

  // Block h.0 alone, on its own input and upstream gradient.
  {
    nn::Module& block = model.blocks()[0];
    const Tensor x = tensor::normal({kBatch, kTime, config.n_embd}, 0, 1, data);
    const Tensor r = tensor::normal({kBatch, kTime, config.n_embd}, 0, 1, data);
    const Tensor y = block.forward(x);
    const Tensor dx = block.backward(r);
    for (const auto& [name, t] : std::vector<std::pair<const char*, Tensor>>{{"x", x}, {"r", r}, {"y", y}, {"dx", dx}})
      out.write_tensor(std::string("/block0/") + name, t);
    write_grads(out, "/block0/grad", block);
    model.zero_grad();
  }

  nn::AdamW opt(model.named_parameters(), 1e-3, {0.9, 0.95}, 1e-8, 0.1);
  opt.set_weight_decay_filter(nn::decay_matrices_only);
  nn::CosineWithWarmup schedule(opt, 5, kSteps, 1e-4);
  nn::CrossEntropyLoss loss;
  std::vector<double> losses, lrs;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    lrs.push_back(opt.lr());
    const Tensor logits = model.forward(xs.select(step));
    losses.push_back(loss.forward(logits, ys.select(step)).item());
    opt.zero_grad();
    model.backward(loss.backward());
    if (step == 0) {
      out.write_tensor("/step0/logits", logits);
      write_grads(out, "/step0/grad", model);
    }
    nn::clip_grad_norm(model.named_parameters(), 1.0);
    opt.step();
    schedule.step();
  }
  out.write_tensor("/losses", Tensor::from_vector(losses, {kSteps}));
  out.write_tensor("/lrs", Tensor::from_vector(lrs, {kSteps}));
  write_state(out, "/final", model.state_dict());
  out.close();
  std::printf("gpt_parity: %lld steps, loss %.6f -> %.6f\n", static_cast<long long>(kSteps), losses.front(),
              losses.back());
  return 0;
}
