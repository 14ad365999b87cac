// ember — convolution, pooling, batch norm and softmax on CUDA through cuDNN's (legacy, still shipped in cuDNN 9)
// API. One cuDNN handle per thread and device, created on first use and bound to ember's current stream before
// every call; RAII descriptors; workspace from the caching allocator (an ember tensor). The convolution algorithm
// of each problem is chosen once and cached (cuda/algo_cache.hpp): by timing every candidate when
// set_benchmark(true) (torch.backends.cudnn.benchmark), by cuDNN's heuristics otherwise.
//
// Tensors here are dense NCHW (ops/ passes contiguous ones). fp16 and bf16 compute in fp32, fp64 in fp64; fp32
// convolutions use TF32 only when set_cudnn_allow_tf32(true).
//
// The parts: cudnn_handle.hpp (EMBER_USE_CUDNN, the handle, descriptors), cudnn_conv.hpp (with the algorithm
// choice), cudnn_pool.hpp, cudnn_batch_norm.hpp and cudnn_softmax.hpp.
#pragma once

#include "ember/cuda/cudnn_batch_norm.hpp"
#include "ember/cuda/cudnn_conv.hpp"
#include "ember/cuda/cudnn_handle.hpp"
#include "ember/cuda/cudnn_pool.hpp"
#include "ember/cuda/cudnn_softmax.hpp"
