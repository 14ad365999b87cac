// ember — expression nodes ("what") and the public element-wise vocabulary: small values describing element-wise
// math over tensors and scalars, built by the operators and functions (`relu(a * b + c)`); nothing runs until the
// expression is assigned to a tensor or reduced. This header includes its parts: the node types
// (expr/node_types.hpp), visiting their leaves and owned copies (expr/leaves.hpp), building nodes from user operands
// (expr/build.hpp) and the public operators and functions (expr/vocabulary.hpp). How an expression is evaluated is
// in evaluator.hpp; where, in cpu/ and cuda/.
#pragma once

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/functors.hpp"
#include "ember/expr/node_types.hpp"
#include "ember/expr/leaves.hpp"
#include "ember/expr/build.hpp"
#include "ember/expr/vocabulary.hpp"
