# Flags for ember's own executables (tests, examples, benchmarks). Never applied to the INTERFACE target:
# users choose their own flags. nvcc gets the host-compiler flags through -Xcompiler.
#   ember_set_target_options(target [NO_WERROR])
# C++ sources build with -Wall -Wextra -Wpedantic, and -Werror under EMBER_WERROR (on for ember's own build; a
# warning in ember's headers is a bug users who add ember with add_subdirectory would see). Third-party headers
# (Eigen, doctest, Google Benchmark, LibTorch) come from imported targets or system folders, so their warnings
# stay out. NO_WERROR: programs built around a third-party library's headers (the LibTorch peer).
# EMBER_SANITIZE (e.g. "address,undefined" or "thread") builds them with those sanitizers (the CI jobs in
# scripts/sanitize.sh).
# g++ collects its garbage each time the heap has doubled since the last collection, from 128 MB (its defaults on
# a machine with more than 1 GB): on ember's TUs, 0.7-4 GB, that is about a tenth of the compile. From 1 GB and at
# 200% growth it collects once or twice. Compiler tuning only: the code generated is the same. Under
# EMBER_GCC_FEWER_GC these go to g++ for ember's own targets (below) and to the header check (tests/CMakeLists.txt).
set(EMBER_GCC_GC_PARAMS --param=ggc-min-expand=200 --param=ggc-min-heapsize=1048576)

# enable_language(CUDA) for ember's own CUDA targets, which are C++20. CMake before 3.26 knows no C++20 flag for
# nvcc and gives every CUDA target -std=c++17 (after ember::cuda's -std=c++20) where nvcc's host compiler defaults
# to an older standard, as clang does; naming the flag lets the targets ask for C++20 through CUDA_STANDARD.
macro(ember_enable_cuda)
  enable_language(CUDA)
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
endmacro()

function(ember_set_target_options target)
  cmake_parse_arguments(arg "NO_WERROR" "" "" ${ARGN})
  set(flags -Wall -Wextra)
  if(EMBER_NATIVE)
    list(APPEND flags -march=native)
  endif()
  set(cxx_gcc_flags "")
  set(cuda_gcc_flags "")
  if(EMBER_GCC_FEWER_GC)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      set(cxx_gcc_flags ${EMBER_GCC_GC_PARAMS})
    endif()
    # nvcc's host compiler: the one CMAKE_CUDA_HOST_COMPILER names, or nvcc's default (gcc on Linux).
    if(CMAKE_CUDA_COMPILER AND (NOT CMAKE_CUDA_HOST_COMPILER OR
                                CMAKE_CUDA_HOST_COMPILER MATCHES "(^|/)(g\\+\\+|gcc|c\\+\\+)[-0-9.]*$"))
      set(cuda_gcc_flags ${EMBER_GCC_GC_PARAMS})
    endif()
  endif()
  set(cuda_host_flags ${flags} ${cuda_gcc_flags})
  list(JOIN cuda_host_flags "," cuda_flags)
  set(cxx_flags ${flags} -Wpedantic ${cxx_gcc_flags})
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

# The CUDA architectures of ember's own nvcc targets (the CUDA tests and benchmarks) when CMAKE_CUDA_ARCHITECTURES is
# not given: the GPU's on a machine that has one (nvidia-smi's compute capability, e.g. 9.0 -> 90), and sm_90's PTX
# only ("90-virtual") on a machine without one, such as CI. cicc still compiles every kernel there; what is skipped is
# ptxas (about 15% of each nvcc TU), whose work the driver does when the binary first runs on a GPU (and caches).
# To build SASS on this machine for a GPU elsewhere: -DCMAKE_CUDA_ARCHITECTURES=90 (or 80, ...).
#   ember_default_cuda_architectures()   (a macro: sets CMAKE_CUDA_ARCHITECTURES in the caller's scope)
macro(ember_default_cuda_architectures)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    if(NOT DEFINED EMBER_DETECTED_CUDA_ARCHITECTURES)
      execute_process(COMMAND nvidia-smi --query-gpu=compute_cap --format=csv,noheader
                      OUTPUT_VARIABLE _ember_cc RESULT_VARIABLE _ember_rc ERROR_QUIET
                      OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(_ember_rc EQUAL 0 AND _ember_cc MATCHES "^([0-9]+)\\.([0-9]+)")
        set(EMBER_DETECTED_CUDA_ARCHITECTURES "${CMAKE_MATCH_1}${CMAKE_MATCH_2}" CACHE INTERNAL "")
        message(STATUS "ember: CUDA tests and benchmarks built for this machine's GPU (sm_${CMAKE_MATCH_1}${CMAKE_MATCH_2})")
      else()
        set(EMBER_DETECTED_CUDA_ARCHITECTURES 90-virtual CACHE INTERNAL "")
        message(STATUS "ember: no GPU here; CUDA tests and benchmarks built as sm_90 PTX "
                       "(-DCMAKE_CUDA_ARCHITECTURES=90 for SASS)")
      endif()
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${EMBER_DETECTED_CUDA_ARCHITECTURES})
  endif()
endmacro()

# ember_precompiled_arch(target arch): compiles `target` (ember::precompiled) and every target that links it with
# -march=<arch>. For the installed package "native" is spelled out as the flags it means on this machine (g++'s
# -march=<name> and every -m<feature> it enables or disables: the name alone can be less, as in a VM whose CPU model
# predates its features), so an installed library and its users agree on one instruction set wherever they are
# compiled; the build tree keeps -march=native. An empty arch adds no flag and warns that the library then holds
# the portable kernels.
function(ember_precompiled_arch target arch)
  if(arch STREQUAL "")
    message(WARNING "ember: EMBER_PRECOMPILED_ARCH is empty: ember::precompiled is compiled without -march, with "
                    "the portable kernels (several times slower GEMMs and convolutions). Set it to native, or to "
                    "the oldest CPU the program must run on (e.g. x86-64-v3 for AVX2).")
    return()
  endif()
  include(CheckCXXCompilerFlag)
  string(MAKE_C_IDENTIFIER "ember_march_${arch}" _ok)
  check_cxx_compiler_flag("-march=${arch}" ${_ok})
  if(NOT ${_ok})
    message(FATAL_ERROR "ember: the compiler does not accept -march=${arch} (EMBER_PRECOMPILED_ARCH); set it to a "
                        "level it knows (native, x86-64-v3, ...) or to \"\" for the compiler's default")
  endif()
  set(installed "-march=${arch}")
  if(arch STREQUAL "native")
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -E -v -x c++ /dev/null
                      OUTPUT_QUIET ERROR_VARIABLE _out RESULT_VARIABLE _rc)
      string(REGEX MATCH "cc1plus [^\n]*" _cc1 "${_out}")
      string(REGEX MATCHALL " -m(arch=|tune=|no-)?[A-Za-z0-9_.=-]+" _flags "${_cc1}")
      string(REPLACE " " "" _flags "${_flags}")
      if(_rc EQUAL 0 AND _flags MATCHES "-march=")
        set(installed ${_flags})
      endif()
    elseif(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -x c++ -c /dev/null -o /dev/null -###
                      ERROR_VARIABLE _out OUTPUT_QUIET RESULT_VARIABLE _rc)
      if(_rc EQUAL 0 AND _out MATCHES "\"-target-cpu\" \"([A-Za-z0-9_.-]+)\"")
        set(installed "-march=${CMAKE_MATCH_1}")
      endif()
    endif()
  endif()
  string(REPLACE ";" "$<SEMICOLON>" _installed_genex "${installed}")  # one list inside the generator expression
  target_compile_options(${target} PUBLIC
    "$<BUILD_INTERFACE:$<$<COMPILE_LANGUAGE:CXX>:-march=${arch}>>"
    "$<INSTALL_INTERFACE:$<$<COMPILE_LANGUAGE:CXX>:${_installed_genex}>>")
  list(GET installed 0 _name)
  list(LENGTH installed _n)
  message(STATUS "ember: ember::precompiled and the targets that link it compile with -march=${arch} "
                 "(installed as ${_name} and ${_n} feature flags)")
endfunction()
