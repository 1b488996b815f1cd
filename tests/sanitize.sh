#!/usr/bin/env bash
# Builds the C++ core and its tests under sanitizers and runs them with ctest:
#   build/asan: AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included)
#   build/tsan: ThreadSanitizer
# core_tests runs directly; runtime_mpi_np2/np4 run the runtime over real MPI under mpirun.
#
#   tests/sanitize.sh            # both
#   tests/sanitize.sh asan       # or: tsan
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
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(asan tsan)

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
  echo "== $name: -fsanitize=$flags in $dir =="
  "$cmake" -S "$repo" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DBLUEFOG_BUILD_TF=OFF -DBLUEFOG_BUILD_TESTS=ON -DBLUEFOG_SANITIZE=$flags \
    -DCMAKE_MAKE_PROGRAM="$ninja" >/dev/null
  "$ninja" -C "$dir"
  (
    # halt_on_error: the first report fails the test instead of scrolling past.
    # fast_unwind_on_malloc=0: full allocation stacks (Open MPI is built without frame
    # pointers), so that a leak inside Open MPI shows the Open MPI frames lsan.supp matches.
    export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1
    export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:report_error_type=1
    export TSAN_OPTIONS=suppressions=$supp/tsan.supp:print_suppressions=0:halt_on_error=1:second_deadlock_stack=1:history_size=4
    cd "$dir"
    PATH=$venv/bin:$PATH "$ctest" --output-on-failure --timeout 600
  )
}

status=0
for c in "${configs[@]}"; do
  if ! run_config "$c"; then
    echo "sanitize.sh: $c FAILED" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "sanitize.sh: all configurations clean (${configs[*]})"
exit $status
