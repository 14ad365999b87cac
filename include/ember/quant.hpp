// ember — INT8 post-training quantization: observers, calibration, int8 Linear and Conv2d on the CPU, and quantized
// models saved as safetensors (<ember/io.hpp>). See quant/quantize.hpp for the recipe;
// without ember::io, include ember/quant/quantize.hpp alone (everything but save and load).
#pragma once

#include "ember/quant/observer.hpp"
#include "ember/quant/layers.hpp"
#include "ember/quant/quantize.hpp"
#include "ember/quant/serialize.hpp"
