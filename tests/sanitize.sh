#!/usr/bin/env bash
# Builds the C++ core and its tests under sanitizers and runs them with ctest:
#   build/asan: AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included)
#   build/tsan: ThreadSanitizer
# core_tests runs directly; runtime_mpi_np2/np4 run the runtime over real MPI under mpirun.
#
#   tests/sanitize.sh            # both, every ctest job
#   tests/sanitize.sh asan       # or: tsan
#   tests/sanitize.sh --ci       # both, CI's subset of the jobs (below); or: --ci asan
#
# SANITIZE_ASAN_TESTS / SANITIZE_TSAN_TESTS: the ctest job names to run under each (space
# separated, each matched whole); unset or empty runs every job. --ci sets both to the
# CI_* lists below.
#
# Open MPI is not built with sanitizers, so reports whose stacks lie entirely inside Open MPI
# (libmpi, libopen-pal, libopen-rte, their plugins, hwloc, pmix, libevent) are suppressed by
# tests/sanitizers/{lsan,tsan}.supp; nothing in bluefog's own code is suppressed. Any other
# report fails the run (non-zero exit).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
venv=${VENV:-$repo/.venv}
cmake=${CMAKE:-$venv/bin/cmake}
ctest=${CTEST:-$venv/bin/ctest}
ninja=${NINJA:-$venv/bin/ninja}
supp=$repo/tests/sanitizers
configs=()
for arg in "$@"; do
  case $arg in
    --ci) ci=1 ;;
    *) configs+=("$arg") ;;
  esac
done
[ ${#configs[@]} -gt 0 ] || configs=(asan tsan)

# CI's subset (`make sanitize-ci`): the ctest jobs (tests/cpp/CMakeLists.txt) run 6 test
# programs, most of them several times under different settings, and every job already runs
# unsanitized in `make test`; what the sanitizers add is per code path, so CI runs each family
# of paths under at least one of them, not every setting under both:
#   pure logic (coordinator, wire, fusion, caches, kernels): core_tests, under both; the
#     compressed collectives' quantizers (block arithmetic on raw buffers): quantize_tests
#     under ASan;
#   the runtime over MPI with the defaults (rounds through shared memory, small collectives in
#     the round, background and calling threads, windows and their thread): runtime_mpi_np2,
#     under both (np4 is the same program and settings with more ranks);
#   the one-host large allreduce paths:
#     direct (process_vm_readv/writev): local_transport_mpi_np3 under ASan, with the staged
#       and shared paths, each algorithm of the list by name, the path choice and the ring
#       after a failed read (the ring's own code); local_transport_gloo_np2 under ASan, the same
#       paths set up over Gloo's communicator (rounds, heap, direct probe through Gloo);
#       runtime_mpi_np3_direct under TSan (the direct path behind the runtime's threads);
#     staged, through the runtime, in 4 KiB steps: runtime_mpi_np3_staged under ASan
#       (runtime_mpi_np3_ring, with the direct path off and the default step, takes the staged
#       path too);
#     MPI: rounds through MPI_Iallgather and small collectives through MPI_Allreduce and the
#       other MPI collectives, not the round's data: runtime_mpi_np3_mpi_paths under ASan;
#   a fault (std::bad_alloc) on the background thread: runtime_fault under ASan.
# Left to `make sanitize` (and unsanitized in `make test`): runtime_mpi_np4,
# runtime_mpi_np3_ring, runtime_mpi_np2_pid_namespaces (the ring where peers cannot be read)
# and runtime_mpi_2hosts (the hierarchical allreduce across pretend hosts, 4 ranks over TCP).
# TSan's list is the shorter: it is the slower build to run, and the races it finds are between
# the threads of one process, which the runtime's default paths and the direct one exercise.
CI_ASAN_TESTS="core_tests quantize_tests runtime_mpi_np2 local_transport_mpi_np3 local_transport_gloo_np2 runtime_mpi_np3_staged runtime_mpi_np3_mpi_paths runtime_fault"
CI_TSAN_TESTS="core_tests runtime_mpi_np2 runtime_mpi_np3_direct"
if [ -n "${ci:-}" ]; then
  SANITIZE_ASAN_TESTS=$CI_ASAN_TESTS
  SANITIZE_TSAN_TESTS=$CI_TSAN_TESTS
fi

# mpirun as root (containers, CI); harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Keep the sanitizer reports free of noise from optional Open MPI transports that probe
# hardware which is not there.
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}

run_config() {
  local name=$1 flags
  case $name in
    asan) flags=address,undefined ;;
    tsan) flags=thread ;;
    *) echo "sanitize.sh: unknown configuration '$name' (asan or tsan)" >&2; return 2 ;;
  esac
  local dir=$repo/build/$name
  # The jobs to run: a ctest regex matching each listed name whole, or every job.
  local var=SANITIZE_${name^^}_TESTS select=()
  local tests=${!var:-}
  if [ -n "$tests" ]; then
    local t regex=""
    for t in $tests; do regex+="${regex:+|}$t"; done
    select=(-R "^($regex)\$")
  fi
  echo "== $name: -fsanitize=$flags in $dir (${tests:-every ctest job}) =="
  # -O1, as the sanitizers' own documentation advises: reports as exact as at -O2, and a
  # build about 30% quicker (451 s against 630 s for the ASan one on 2 cores).
  "$cmake" -S "$repo" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 \
    -DBLUEFOG_BUILD_TF=OFF -DBLUEFOG_BUILD_TESTS=ON -DBLUEFOG_SANITIZE=$flags \
    -DCMAKE_MAKE_PROGRAM="$ninja" >/dev/null
  # With a list, only the test programs its jobs run are built (the core library with them):
  # the other test programs and the bench programs are about a fifth of its compile steps.
  # (Read from the generated CTestTestfile.cmake: ctest -N shows no command before the build.)
  local targets=()
  if [ -n "$tests" ]; then
    local lines="" t
    for t in $tests; do
      lines+=$(grep -hE "^add_test\((\[=*\[)?$t(\]=*\])? " \
                 $(find "$dir" -name CTestTestfile.cmake) || true)$'\n'
    done
    targets=($(grep -o '[A-Za-z0-9_]*_tests\b' <<<"$lines" | sort -u))
  fi
  "$ninja" -C "$dir" "${targets[@]}"
  (
    # halt_on_error: the first report fails the test instead of scrolling past.
    # fast_unwind_on_malloc=0: full allocation stacks (Open MPI is built without frame
    # pointers), so that a leak inside Open MPI shows the Open MPI frames lsan.supp matches.
    export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1
    export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:report_error_type=1
    export TSAN_OPTIONS=suppressions=$supp/tsan.supp:print_suppressions=0:halt_on_error=1:second_deadlock_stack=1:history_size=4
    cd "$dir"
    if [ -n "$tests" ]; then
      # A listed name that is no ctest job (renamed, say) fails instead of quietly running less.
      local listed
      listed=$("$ctest" -N | sed -n 's/^ *Test *#[0-9]*: //p')
      for t in $tests; do
        grep -qx "$t" <<<"$listed" || { echo "sanitize.sh: no ctest job named '$t'" >&2; exit 2; }
      done
    fi
    PATH=$venv/bin:$PATH "$ctest" --output-on-failure --timeout 600 "${select[@]}"
  )
}

status=0
for c in "${configs[@]}"; do
  if ! run_config "$c"; then
    echo "sanitize.sh: $c FAILED" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "sanitize.sh: all configurations clean (${configs[*]}${ci:+, CI subset})"
exit $status
