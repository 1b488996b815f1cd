# Stage timing for .ci/run (sourced; bash). Each `stage NAME CMD...` runs CMD, prints
#   ci: stage NAME <seconds> s            (or: ... s FAILED (exit N))
# when it finishes and returns CMD's status, so that under `set -e` a failing stage still ends
# the run. On exit (success, failure or a signal) the EXIT trap prints every stage that ran,
# with its time and result, then `ci: total <seconds> s`, and exits with the run's status.
# CI_WARN_S (default 4500 s, 75 minutes): a total above it also prints a warning, as CI is
# killed at 90 minutes.

ci_names=()
ci_secs=()
ci_results=()
ci_current=""
ci_current_start=0
ci_start=$SECONDS

stage() {
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "ci: start $name: $*"
  ci_current=$name
  ci_current_start=$t0
  "$@" || rc=$?
  ci_current=""
  local secs=$((SECONDS - t0))
  ci_names+=("$name")
  ci_secs+=("$secs")
  if [ "$rc" -eq 0 ]; then
    ci_results+=(ok)
    echo "ci: stage $name $secs s"
  else
    ci_results+=("FAILED (exit $rc)")
    echo "ci: stage $name $secs s FAILED (exit $rc)"
  fi
  return "$rc"
}

ci_summary() {
  local rc=$? i total=$((SECONDS - ci_start))
  trap - EXIT INT TERM
  if [ -n "$ci_current" ]; then  # a signal arrived during a stage
    ci_names+=("$ci_current")
    ci_secs+=("$((SECONDS - ci_current_start))")
    ci_results+=("INTERRUPTED (exit $rc)")
  fi
  echo
  echo "ci: summary"
  for i in "${!ci_names[@]}"; do
    printf 'ci:   %-22s %6s s  %s\n' "${ci_names[$i]}" "${ci_secs[$i]}" "${ci_results[$i]}"
  done
  echo "ci: total $total s ($((total / 60)) min $((total % 60)) s), exit $rc"
  if [ "$total" -gt "${CI_WARN_S:-4500}" ]; then
    echo "ci: WARNING: total $total s is over ${CI_WARN_S:-4500} s; CI is killed at 5400 s (90 minutes)"
  fi
  exit "$rc"
}

trap ci_summary EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
