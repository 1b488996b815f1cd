#!/bin/sh
# Runs its arguments as the first process of a new PID namespace, so that every rank of a job
# sees itself as process 1 (as ranks in separate containers of one host may). Exit status 77
# (ctest's skip) where this machine cannot make PID namespaces.
if ! unshare --pid --fork true 2>/dev/null; then
  echo "PID namespaces are not available here (unshare --pid failed): skipped" >&2
  exit 77
fi
exec unshare --pid --fork "$@"
