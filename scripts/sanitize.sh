#!/usr/bin/env bash
# CI's sanitizer jobs (run by ctest as sanitize_asan and sanitize_thread): configure and build ember's doctest
# suite in BUILD_DIR with the sanitizers, then run it; any report fails the job.
#   asan    AddressSanitizer + UndefinedBehaviorSanitizer over the whole suite
#   thread  ThreadSanitizer over the threaded parts: the thread pool (test_threads), the caching CPU allocator
#           (test_tensor's allocator cases), the DataLoader (test_data), the rendezvous store (test_store's dist::Store*
#           cases: its server thread, clients on other threads, the soak) and the collective layer (test_dist:
#           progress threads, the store's server thread, DDP's hooks)
# Both also run the distributed tests (their ranks are processes of the same sanitized program) in their quick form
# (EMBER_TEST_DIST_QUICK: sizes up to 4 Ki elements), without the case that needs mpirun (MPI is not instrumented).
# usage: scripts/sanitize.sh asan|thread BUILD_DIR
set -euo pipefail
job=${1:?usage: sanitize.sh asan|thread BUILD_DIR} dir=${2:?usage: sanitize.sh asan|thread BUILD_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
filters=()
case $job in
  asan)
    # clang at -O0: g++ -O1 with UBSan compiled the suite 4x slower than clang -O0 (a 300 s TU against 65 s), and the
    # suite runs in ~2 min at -O0 under the sanitizers. Checked with clang's warnings, -Werror included.
    # The suite links ember::precompiled (EMBER_TESTS_PRECOMPILED), built here with the same sanitizers: a quarter less
    # compile time than header-only at -O0. Its files share a precompiled header of doctest and <ember/ember.hpp>
    # (EMBER_TESTS_PCH): on a 2-core Zen 4 the suite's files then built in 352 s instead of 427 s.
    san=address,undefined files="" cxx=clang++ opt=-O0 pre=ON pch=ON
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
  thread)
    # Five files only: header-only (building the precompiled library too would cost more than it saves).
    san=thread files="test_threads;test_tensor;test_data;test_dist;test_store" cxx=c++ opt=-O1 pre=OFF pch=OFF
    filters=(-tc='thread pool*,CpuCachingAllocator*,DataLoader*,*worker*,*thread*,dist::Store*')
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
    ;;
  *) echo "usage: sanitize.sh asan|thread BUILD_DIR" >&2; exit 2 ;;
esac
start=$SECONDS
# -g1: line numbers in reports. CUDA, examples and benchmarks are not part of these jobs.
cmake -S "$root" -B "$dir" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$opt -g1" \
  -DEMBER_SANITIZE="$san" \
  -DEMBER_TEST_FILES="$files" -DEMBER_TESTS_PRECOMPILED="$pre" -DEMBER_TESTS_PCH="$pch" -DEMBER_WITH_CUDA=OFF -DEMBER_BUILD_EXAMPLES=OFF \
  -DEMBER_BUILD_BENCH=OFF -DEMBER_INSTALL=OFF >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j2 --target ember_tests ember_tests_dist
echo "sanitize $job: built in $((SECONDS - start)) s"
cd "$root/tests"  # fixture paths are compiled in; tests that write files use their own temporary folders
# The suite runs as two processes side by side, split by file (each case runs once: the second takes every file the
# first does not), and the distributed tests after the second. Under ASan at -O0 the suite alone takes ~110 s on
# one core, the last minutes of CI with the other core idle; the GEMM, thread-pool, expression and io files are
# about half of it.
first='*/test_gemm.cpp,*/test_threads.cpp,*/test_expr.cpp,*/test_io.cpp'
part() {  # part NAME COMMAND...: runs it with its output in $dir/NAME.log; returns its status
  local name=$1
  shift
  "$@" >"$dir/$name.log" 2>&1
}
rm -f "$dir/suite-1.log" "$dir/suite-2.log" "$dir/dist.log"
part suite-1 "$dir/tests/ember_tests" "${filters[@]}" --source-file="$first" &
pid=$!
rc2=0
{ part suite-2 "$dir/tests/ember_tests" "${filters[@]}" --source-file-exclude="$first" &&
  part dist env EMBER_TEST_DIST_QUICK=1 "$dir/tests/ember_tests_dist" -tce='*mpi backend*'; } || rc2=$?
rc1=0
wait "$pid" || rc1=$?
for name in suite-1 suite-2 dist; do
  [ -f "$dir/$name.log" ] && { echo "---- sanitize $job: $name"; cat "$dir/$name.log"; }
done
if [ "$rc1" -ne 0 ] || [ "$rc2" -ne 0 ]; then
  echo "sanitize $job: failed (first part: $rc1, second part and distributed tests: $rc2)"
  exit 1
fi
echo "sanitize $job: passed in $((SECONDS - start)) s"
