// ember — INT8 post-training quantization: observers, calibration, int8 Linear and Conv2d on the CPU, and quantized
// models saved as safetensors (needs nlohmann/json: CMake target ember::io). See quant/quantize.hpp for the recipe.
#pragma once

#include "ember/quant/observer.hpp"
#include "ember/quant/layers.hpp"
#include "ember/quant/quantize.hpp"
