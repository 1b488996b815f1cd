#!/bin/sh
# A stand-in for ssh in the launcher tests: `fake_rsh.sh HOST COMMAND` runs COMMAND here with
# sh, as `ssh HOST COMMAND` runs it with the remote shell (the environment is not inherited).
host=$1
shift
echo "FAKE_RSH $host" >&2
exec env -i PATH="$PATH" HOME="$HOME" sh -c "$*"
