#!/usr/bin/env bash
# Runs tests/cpp/path_cache_runs_test.cc's program as a sequence of jobs in one fresh cache
# directory: a first run learns every class and writes the file; a second starts from it and
# learns nothing; a damaged file is ignored (learn again, file rewritten); a relearn run ignores
# a good one. Usage: path_cache_runs.sh LAUNCHER... PROGRAM (each run appends DIR and MODE).
set -eu
dir=$(mktemp -d /tmp/bluefog-path-cache.XXXXXX)
trap 'rm -rf "$dir"' EXIT
run() {
  echo "== $1"
  "${launch[@]}" "$dir" "$1"
}
launch=("$@")
run learn
run cached
file=$(ls "$dir"/path_choices.*.txt)
[ "$(stat -c %a "$dir")" = 700 ] && [ "$(stat -c %a "$file")" = 600 ] || {
  echo "cache directory or file not private: $(stat -c '%a %n' "$dir" "$file")"
  exit 1
}
head -c 40 "$file" > "$file.cut" && mv "$file.cut" "$file"  # cut short
run learn
run cached
run relearn
run cached
