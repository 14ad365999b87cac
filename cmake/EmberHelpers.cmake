# Flags for ember's own executables (tests, examples, benchmarks). Never applied to the INTERFACE target:
# users choose their own flags. nvcc gets the host-compiler flags through -Xcompiler.
function(ember_set_target_options target)
  set(flags -Wall -Wextra)
  if(EMBER_NATIVE)
    list(APPEND flags -march=native)
  endif()
  list(JOIN flags "," cuda_flags)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${flags}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${cuda_flags}>")
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)  # -std=c++20, not gnu++20
endfunction()
