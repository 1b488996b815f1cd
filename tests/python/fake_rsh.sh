#!/bin/sh
# A stand-in for ssh in the launcher tests: `fake_rsh.sh HOST COMMAND` runs COMMAND here with
# sh, as `ssh HOST COMMAND` runs it with the remote shell (the environment is not inherited).
host=$1
shift
echo "FAKE_RSH $host" >&2
if [ -n "${FAKE_RSH_SESSION:-}" ]; then
  # As sshd starts it: the remote shell in a session of its own, which nothing done to this
  # process's group reaches; only its input closing does.
  exec setsid -w env -i PATH="$PATH" HOME="$HOME" sh -c "$*"
fi
exec env -i PATH="$PATH" HOME="$HOME" sh -c "$*"
