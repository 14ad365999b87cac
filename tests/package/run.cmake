# Builds and runs tests/package/consumer against ember the way a user would. Run by CTest:
#   cmake -DMODE=add_subdirectory|find_package -DSOURCE_DIR= -DWORK_DIR= -DPREFIX= -DGENERATOR= -DCXX=
#         -DWITH_CUDA= [-DBUILD_DIR=] -P run.cmake
# find_package installs ember into PREFIX first: from BUILD_DIR, the build tree this test belongs to (already built,
# as a user installs after building: `cmake --install build`), or, without BUILD_DIR, from a Release build of its own.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DEMBER_WITH_CUDA=${WITH_CUDA})
file(REMOVE_RECURSE ${WORK_DIR})
if(MODE STREQUAL "find_package")
  file(REMOVE_RECURSE ${PREFIX})
  if(BUILD_DIR)
    # The installed targets (ember::precompiled, ember-run) are part of the default build, so they are built.
    run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
  else()
    run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/ember-build ${common} -DCMAKE_BUILD_TYPE=Release
        -DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_EXAMPLES=OFF -DEMBER_BUILD_BENCH=OFF)
    run(${CMAKE_COMMAND} --build ${WORK_DIR}/ember-build --parallel 2)
    run(${CMAKE_COMMAND} --install ${WORK_DIR}/ember-build --prefix ${PREFIX})
  endif()
  set(how -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_TYPE=Release)
elseif(MODE STREQUAL "add_subdirectory")
  # A Debug project vendoring ember: the other build type a user has (find_package covers Release), and the vendored
  # ember::precompiled then compiles without optimisation, in about half the time.
  set(how -DEMBER_SOURCE_DIR=${SOURCE_DIR} -DCMAKE_BUILD_TYPE=Debug)
else()
  message(FATAL_ERROR "MODE must be add_subdirectory or find_package, not '${MODE}'")
endif()

run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/consumer ${common} ${how})
if(MODE STREQUAL "find_package")
  # The consumer must have found the package just installed, not some other ember.
  file(STRINGS ${WORK_DIR}/consumer/CMakeCache.txt ember_dir REGEX "^ember_DIR:")
  string(FIND "${ember_dir}" "${PREFIX}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "consumer found ember elsewhere: ${ember_dir} (expected under ${PREFIX})")
  endif()
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer --parallel 2)  # the C++ and the CUDA consumer side by side
run(${WORK_DIR}/consumer/consumer)
run(${WORK_DIR}/consumer/consumer_precompiled)
file(READ ${WORK_DIR}/consumer/ember-run.txt ember_run)
if(MODE STREQUAL "find_package")
  string(FIND "${ember_run}" "${PREFIX}/" at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "ember::ember-run is ${ember_run}, not the installed one under ${PREFIX}")
  endif()
endif()
run(${ember_run} -n 2 ${WORK_DIR}/consumer/consumer_dist)
if(EXISTS ${WORK_DIR}/consumer/consumer_cuda)
  run(${WORK_DIR}/consumer/consumer_cuda)
endif()
message(STATUS "package_${MODE}: consumer built and ran")
