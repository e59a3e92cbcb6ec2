// How the CUDA backend may round f32 products: PyTorch's allow_tf32 switches
// (torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32) as one.
//
// Off by default: an f32 matmul or Linear on a GPU is cuBLAS's f32 gemm, and f32 causal
// attention takes each product as three TF32 ones ("3xTF32"), both f32-accurate. On:
// f32 gemms (cuBLAS's CUBLAS_COMPUTE_32F_FAST_TF32, the Linear's bias epilogue
// included) and f32 attention take one TF32 product each, whose operands keep 10 of
// f32's 23 mantissa bits (about 1e-3 relative error in a product of sums of ~1000
// terms, what PyTorch users accept with allow_tf32), for several times the rate on
// tensor cores. bf16, f16, f64 and host products are unaffected. The switch is
// process-wide and read at each call, like PyTorch's; it is not a per-thread mode.
#pragma once

namespace troupe::tensor {

// Without a CUDA backend (a build without CUDA, or its plugin missing) setting it has
// nothing to change and cuda_allow_tf32() stays false.
void set_cuda_allow_tf32(bool allow);
bool cuda_allow_tf32();

}  // namespace troupe::tensor
