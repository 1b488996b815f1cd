#!/usr/bin/env bash
# Runs pytest on one rank of an MPI job, or of a Gloo job (RANK and WORLD_SIZE, no mpirun). Rank 0 prints to the terminal; the others write a log that is
# shown only if that rank fails, so a failure on any rank is visible and fails the job.
set -u
# Each run learns the one-host paths afresh (some tests count the calls of the untimed start), so
# no path choices of earlier runs.
export BLUEFOG_PATH_CACHE=${BLUEFOG_PATH_CACHE:-0}
python=$1; shift
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${RANK:-0}}}
size=${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${WORLD_SIZE:-1}}}
if [ "$rank" = 0 ]; then
  exec "$python" -m pytest -q -p no:cacheprovider "$@"
fi
log=$(mktemp "/tmp/bluefog-pytest-np${size}-rank${rank}.XXXXXX")
"$python" -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "---- rank $rank of $size failed (exit $rc); its output: ----" >&2
  cat "$log" >&2
fi
rm -f "$log"
exit $rc
