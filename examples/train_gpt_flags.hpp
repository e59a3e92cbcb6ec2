// train_gpt's command line: its flags, their presets and checks (train_gpt.cpp says
// what the program does).
#pragma once

#include <cstdint>
#include <string>

namespace troupe::examples {

struct Flags {
  std::string data = TROUPE_TEXT_PATH;  // the copy in the source tree's data/
  std::string preset = "quick";
  // The model (nanoGPT's names); -1: the preset's.
  std::int64_t n_layer = -1, n_head = -1, n_embd = -1, block_size = -1;
  double dropout = -1;
  std::int64_t activation_checkpointing = 0;  // recompute every N-th block in backward (0: none)
  int tp = 1;                                 // ranks each model is split over (tensor parallelism)
  bool sequence_parallel = false;             // and the positions between its layers (Megatron's)
  int pp = 1;                                 // pipeline stages
  std::string schedule = "1f1b";
  int micro_batches = 4;
  int virtual_stages = 0;             // stages a rank under --schedule interleaved (0: 2 there, else 1)
  std::string pp_cut = "parameters";  // how the blocks are cut into stages (parallel::PipelineCut)
  // Optimisation; -1: the preset's.
  std::int64_t batch_size = -1, steps = -1, warmup_steps = -1, eval_every = -1, eval_samples = -1;
  double lr = -1, min_lr = -1, weight_decay = 0.1, grad_clip = 1.0, beta2 = 0.99;
  int accum_steps = 1;
  std::uint64_t seed = 1337;
  std::string sharding = "ddp", device = "cpu", precision = "f32";
  std::string backend;  // cuda: nccl (empty) or mpi, staged through host memory
  std::string metrics, checkpoint_dir;
  std::string trace, trace_steps;  // --trace DIR --trace-steps FIRST-LAST (step_trace.hpp)
  int save_every = 0, keep_last = 3;
  std::int64_t sample_chars = 300;
  double temperature = 0.8;
  double require_val_loss = 0;  // exit status 3 if the final validation loss is higher (0: no check)
  double peak_gflops = 0;       // one rank's peak for MFU (0: what a matmul reaches on this core)
};

// The flags with the preset's values filled in and every value checked: a bad one is
// an InvalidArgument carrying the usage; --help prints it and exits 0.
Flags parse_flags(int argc, char** argv);

}  // namespace troupe::examples
