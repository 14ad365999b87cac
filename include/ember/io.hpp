// ember — reading and writing tensors: safetensors files (PyTorch/Hugging Face compatible), atomic file
// replacement and training checkpoints. Separate from ember/ember.hpp because it needs nlohmann/json (Debian's
// nlohmann-json3-dev), a large header that code without files should not pay for; link the CMake target ember::io.
#pragma once

#include "ember/io/any_tensor.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/io/checkpoint.hpp"
