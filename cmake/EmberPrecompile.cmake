# Faster rebuilds for programs that use ember (see README, "Building fast"). Included by ember's CMakeLists.txt
# and by the installed package configuration.
#
#   ember_target_precompile_headers(<target> [DATA] [IO])
#
# Gives <target> a precompiled header of <ember/ember.hpp> (plus <ember/data.hpp> with DATA, <ember/io.hpp> with
# IO): the headers are parsed once per target instead of once per translation unit. The target must already link
# ember (ember::ember, ember::io or ember::cuda) so the header compiles with the target's own flags.
function(ember_target_precompile_headers target)
  cmake_parse_arguments(arg "DATA;IO" "" "" ${ARGN})
  set(headers <ember/ember.hpp>)
  if(arg_DATA)
    list(APPEND headers <ember/data.hpp>)
  endif()
  if(arg_IO)
    list(APPEND headers <ember/io.hpp>)
  endif()
  target_precompile_headers(${target} PRIVATE ${headers})
endfunction()
