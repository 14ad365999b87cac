// ember — reading and writing tensors: safetensors files (PyTorch/Hugging Face compatible), atomic file
// replacement and training checkpoints. Separate from ember/ember.hpp so that code without files does not parse it
// (CMake target ember::io, which needs nothing beyond ember::ember: ember reads and writes the JSON itself).
#pragma once

#include "ember/io/any_tensor.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/io/checkpoint.hpp"
