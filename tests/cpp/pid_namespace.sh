#!/bin/sh
# Runs its arguments as the first process of a new PID namespace, so that every rank of a job
# sees itself as process 1 (as ranks in separate containers of one host may). Exit status 77
# (ctest's skip) where this machine cannot make PID namespaces.
if ! unshare --pid --fork setarch "$(uname -m)" -R true 2>/dev/null; then
  echo "PID namespaces (unshare --pid) or setarch -R are not available here: skipped" >&2
  exit 77
fi
# Without address randomization both ranks have their buffers and probe token at the same
# addresses, so a rank reading "process 1" (itself) finds a value where its peer published one:
# only the token tells them apart.
exec unshare --pid --fork setarch "$(uname -m)" -R "$@"
