// A checkpoint of random weights made from a config alone: `--load-format dummy` for every backend and for tensor
// parallel, where a real checkpoint of the shape is too big to write (K3's 1.56 TB) or not at hand.
//
// It holds the tensors the weight binder looks up, under the names, shapes and dtypes of a real K3 / Kimi-Linear HF
// directory (python/k3ref/checkpoint.py writes the same list; test DummyCheckpoint.MatchesTheRealTensorList keeps
// them equal). Each matrix is a VIEW into a pool of random bf16 values shared by every matrix of the same input
// width, N(0, 1 / width) as the reference's initialiser: a 1.5 TB model costs a few GB of host memory, and the
// binder, the tensor-parallel sharding (row views, column copies) and the device uploads take it as they take a
// mapped file. MXFP4 experts view pools of random packed bytes with e8m0 scales near 1 / (3 sqrt(width)). Vectors
// (norms, conv taps, gates' biases, router bias) are drawn per tensor. Values are random but well scaled: the
// routing is near-uniform, text is gibberish. Speeds: real on a GPU (the upload gives every matrix its own copy);
// on the CPU the matrices of a width share their bytes, so caches see fewer distinct bytes than a real model's and
// `k3 bench`'s GB/s column overstates DRAM traffic: use it there for shapes and the sharded paths, not bandwidth.
#pragma once
#include <cstdint>

#include "k3/model/config.h"
#include "k3/model/model_files.h"

namespace k3 {

// The same seed gives the same weights (tensor parallel ranks each make the whole model's views and slice them, so
// every rank must draw the same values).
ModelFiles dummy_model_files(const ModelConfig& c, uint64_t seed = 0);

}  // namespace k3
