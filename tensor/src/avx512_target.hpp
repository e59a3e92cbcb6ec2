// The attribute that compiles one function for AVX-512, for the host loops and the GEMM
// kernel that pick their instruction set at run time. GCC takes the preferred vector
// width in the target string; clang (the fuzz build) refuses it there and takes
// min_vector_width instead.
#pragma once

#if defined(__clang__)
#define TROUPE_AVX512_TARGET \
  [[gnu::target("avx512f,avx512dq,avx512bw,avx512vl")]] __attribute__((min_vector_width(512)))
#else
#define TROUPE_AVX512_TARGET [[gnu::target("avx512f,avx512dq,avx512bw,avx512vl,prefer-vector-width=512")]]
#endif
