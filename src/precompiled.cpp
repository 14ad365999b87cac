// The ember_precompiled library (CMake target ember::precompiled, opt-in): the instantiations that <ember/ember.hpp>
// and <ember/data.hpp> declare `extern` under EMBER_PRECOMPILED, and the bodies of the non-template functions
// declared EMBER_HEADER_INLINE (config.hpp), compiled once here. This must stay the library's only TU: those bodies
// are ordinary (non-inline) definitions in it. With EMBER_PRECOMPILED_IO (CMake always sets it) it holds
// <ember/io.hpp>'s too.
#define EMBER_PRECOMPILED_BUILD
#include <ember/core/atomic_file.hpp>
#include <ember/data.hpp>
#include <ember/ember.hpp>
#ifdef EMBER_PRECOMPILED_IO
#include <ember/io.hpp>
#endif
