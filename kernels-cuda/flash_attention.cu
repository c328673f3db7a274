// Fused causal self-attention (flash-attention style), forward and backward.
// (Kernels are being written; no entry points yet.)
#include "common.cuh"
