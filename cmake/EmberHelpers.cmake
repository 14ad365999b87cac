# Flags for ember's own executables (tests, examples, benchmarks). Never applied to the INTERFACE target:
# users choose their own flags. nvcc gets the host-compiler flags through -Xcompiler.
#   ember_set_target_options(target [NO_WERROR])
# C++ sources build with -Wall -Wextra -Wpedantic, and -Werror under EMBER_WERROR (on for ember's own build; a
# warning in ember's headers is a bug users who add ember with add_subdirectory would see). Third-party headers
# (Eigen, doctest, Google Benchmark, LibTorch) come from imported targets or system folders, so their warnings
# stay out. NO_WERROR: programs built around a third-party library's headers (the LibTorch peer).
# EMBER_SANITIZE (e.g. "address,undefined" or "thread") builds them with those sanitizers (the CI jobs in
# scripts/sanitize.sh).
function(ember_set_target_options target)
  cmake_parse_arguments(arg "NO_WERROR" "" "" ${ARGN})
  set(flags -Wall -Wextra)
  if(EMBER_NATIVE)
    list(APPEND flags -march=native)
  endif()
  list(JOIN flags "," cuda_flags)
  set(cxx_flags ${flags} -Wpedantic)
  if(EMBER_WERROR AND NOT arg_NO_WERROR)
    list(APPEND cxx_flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${cxx_flags}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${cuda_flags}>")
  if(EMBER_SANITIZE)
    set(san -fsanitize=${EMBER_SANITIZE} -fno-omit-frame-pointer)
    if(EMBER_SANITIZE MATCHES "undefined")
      list(APPEND san -fno-sanitize-recover=undefined)
    endif()
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${san}>")
    target_link_options(${target} PRIVATE ${san})
  endif()
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)  # -std=c++20, not gnu++20
endfunction()
