// The ember_precompiled library (CMake target ember::precompiled, opt-in): the instantiations that <ember/ember.hpp>
// and <ember/data.hpp> declare `extern` under EMBER_PRECOMPILED, compiled once here.
#define EMBER_PRECOMPILED_BUILD
#include <ember/data.hpp>
#include <ember/ember.hpp>
