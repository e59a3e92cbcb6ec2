// Causal multi-head self-attention from a fused QKV projection: the core of a GPT
// block, as one forward and one backward (torch's scaled_dot_product_attention with
// is_causal=True, applied to nanoGPT's c_attn output).
//
// qkv is [B, T, 3C]: q, k and v side by side along the last dimension, head h in
// columns [h*D, (h+1)*D) of each (D = C / n_head). The output is [B, T, C] with head
// h in the same columns: nanoGPT's y.transpose(1, 2).view(B, T, C), ready for c_proj.
//   S = q k^T / sqrt(D), masked above the diagonal; P = softmax(S); y = dropout(P) v
//
// The forward saves each row's log-sum-exp of S, and the backward recomputes P from it
// (the flash-attention recipe), so memory between forward and backward is O(B H T),
// not O(B H T^2). One exception: on the CPU, where P is at most twice the size of qkv
// (T <= 6 D), the forward keeps it (`probs`), which saves the backward a third of the
// forward's products and an exp per score. Attention dropout draws its mask
// from Philox blocks reserved from a Generator, a pure function of (seed, offset,
// position), so the backward regenerates the same mask instead of storing it.
//
// CPU: per (batch, head) two OpenBLAS gemms forward and four backward (five when P is
// recomputed), in blocks of 64 query rows that skip the masked upper triangle; f32
// and f64, bf16 computed in f32. CUDA (cuda_attention.cu): one fused kernel forward
// (online softmax) and two backward (dq, then dk and dv, so that no gradient is summed
// with atomics and every run gives the same bits); f32, f64, bf16 (f32 accumulation);
// head size up to 128. Both devices draw the same dropout mask.
#pragma once

#include <cstdint>

#include "troupe/tensor/random.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

struct AttentionForward {
  Tensor out;          // [B, T, C], qkv's dtype
  Tensor log_sum_exp;  // [B, n_head, T], f64 for f64 qkv, else f32: each row's logsumexp of the scaled, masked scores
  // CPU, T <= 6 D only: [B, n_head, T, T], P before dropout (zero above the diagonal up
  // to the end of the row's 64-row block, unspecified past it); undefined elsewhere,
  // and then the backward recomputes P from log_sum_exp.
  Tensor probs;
  double dropout_p = 0;                // the probability the forward dropped with (0: none)
  std::uint64_t seed = 0, offset = 0;  // where its dropout mask was drawn
};

// `dropout_p` in [0, 1); when > 0, blocks for the mask are reserved from `gen`.
AttentionForward causal_attention_forward(const Tensor& qkv, std::int64_t n_head, double dropout_p, Generator& gen);
// d loss / d qkv, [B, T, 3C], from d loss / d out and what the forward saved.
Tensor causal_attention_backward(const Tensor& grad_out, const Tensor& qkv, const AttentionForward& forward,
                                 std::int64_t n_head);

}  // namespace troupe::tensor
