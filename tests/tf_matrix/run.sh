#!/usr/bin/env bash
# bluefog on every supported TensorFlow, installed the way the README tells users to.
#
#   tests/tf_matrix/run.sh dist/bluefog_tf-<version>.tar.gz      (make test-tf-matrix)
#   TF_VERSIONS="2.16:keras==3.3.3" TF_SKEW_PYTHON=.venv/bin/python tests/tf_matrix/run.sh ...  (CI)
#
# For each version in TF_VERSIONS (default: 2.16 ... 2.21): a venv under build/tf-matrix/tf<v>
# with tensorflow-cpu==<v>.* and the build tools, bluefog installed from the sdist with
#   pip install --no-build-isolation <sdist>
# and the smoke suite run on 2 ranks from outside the checkout (so the installed package is
# what is tested). The next version's venv is prepared in the background while one version
# builds and runs. Venvs are kept: a rerun reinstalls bluefog only when the sdist changed;
# TF_MATRIX_KEEP=0 (CI) removes each one once no later check needs it (about 1.4 GB each).
# Finally an op library built for one version is imported with another TensorFlow, which must
# fail with the "rebuild" ImportError, and installing into an unsupported TensorFlow (2.15) must
# stop with the build's "unsupported" message. Prints one result line each and the wall time.
set -uo pipefail

SDIST=$(readlink -f "${1:?usage: $0 SDIST}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
# Each entry: a TensorFlow release, optionally with a pin for what pip would otherwise pick the
# newest of (2.16:keras==3.3.3 is TensorFlow 2.16 with the Keras of its time, as users have it).
VERSIONS=${TF_VERSIONS:-"2.16:keras==3.3.3 2.16 2.17 2.18 2.19 2.20 2.21"}
ROOT=${TF_MATRIX_DIR:-$REPO/build/tf-matrix}
SMOKE_TIMEOUT=${SMOKE_TIMEOUT:-600}
KEEP=${TF_MATRIX_KEEP:-1}
# The smoke suite: the seed's collectives and their gradients (eager, tf.function, v1 graphs),
# Keras 3 model.fit with DistributedOptimizer and the callbacks, DistributedGradientTape.
SMOKE=(tests/python/mpi/test_collectives.py tests/python/mpi/test_eager_calls.py
       tests/python/mpi/test_gradients.py
       tests/python/mpi/test_keras.py tests/python/mpi/test_optimizers.py
       tests/python/mpi/test_v1_optimizer.py tests/python/mpi/test_broadcast_variables.py)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$ROOT"
start=$(date +%s)
sdist_sum=$(sha256sum "$SDIST" | cut -d' ' -f1)

# A venv with tensorflow-cpu==<v>.* and what building and testing bluefog needs (what a user's
# environment has, plus the build tools the README lists). Kept once complete.
prepare() {
  local v=${1%%:*} pin="" venv=$ROOT/tf${1//[:=]/-}
  [[ "$1" == *:* ]] && pin=${1#*:}
  [ -f "$venv/.ready" ] && return 0
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv" || return 1
  "$venv/bin/pip" install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  "$venv/bin/pip" install -q "tensorflow-cpu==$v.*" $pin scikit-build-core cmake ninja \
    pytest pytest-timeout 2>&1 | grep -v '^WARNING: Location'
  "$venv/bin/python" -c "import tensorflow" 2>/dev/null || return 1
  touch "$venv/.ready"
}

# A release outside the supported range, whose install must stop with the "unsupported" message.
UNSUPPORTED=${TF_UNSUPPORTED-2.15}

versions=($VERSIONS)
declare -A result
venv_of() { echo "$ROOT/tf${1//[:=]/-}"; }
# The version-skew check below uses the first and last entries (of different releases).
first=${versions[0]:-}; last=${versions[-1]:-}
# With TF_MATRIX_KEEP=0 a venv goes as soon as nothing later needs it (its log stays).
drop() { [ "$KEEP" = 0 ] && rm -rf "$(venv_of "$1")"; return 0; }
log_of() { echo "$(venv_of "$1").log"; }
prepare "${versions[0]}" >"$(log_of "${versions[0]}")" 2>&1 &
prep_pid=$!
for i in "${!versions[@]}"; do
  v=${versions[$i]}
  venv=$(venv_of "$v")
  log=$(log_of "$v")
  wait "$prep_pid"; prep_ok=$?
  next=${versions[$((i + 1))]:-}
  if [ -z "$next" ] && [ -n "$UNSUPPORTED" ]; then
    next=$UNSUPPORTED
  fi
  if [ -n "$next" ]; then
    prepare "$next" >"$(log_of "$next")" 2>&1 &
    prep_pid=$!
  fi
  t0=$(date +%s)
  if [ $prep_ok -ne 0 ]; then
    result[$v]="FAIL (installing tensorflow-cpu==${v%%:*}.* ${v#*:}; see $log)"; continue
  fi
  tf_version=$("$venv/bin/python" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null)
  keras_version=$("$venv/bin/python" -c "import keras; print(keras.__version__)" 2>/dev/null)
  # The documented install command (after removing a bluefog built from an older sdist; not
  # --force-reinstall, which would also upgrade numpy past what this TensorFlow supports).
  if [ "$(cat "$venv/.bluefog-sdist" 2>/dev/null)" != "$sdist_sum" ]; then
    "$venv/bin/pip" uninstall -q -y bluefog-tf >>"$log" 2>&1
    echo "== tf $v: pip install --no-build-isolation --no-cache-dir $(basename "$SDIST")" >>"$log"
    if ! "$venv/bin/pip" install --no-build-isolation --no-cache-dir "$SDIST" >>"$log" 2>&1; then
      result[$v]="FAIL (building bluefog; see $log)"; continue
    fi
    echo "$sdist_sum" >"$venv/.bluefog-sdist"
  fi
  built=$(( $(date +%s) - t0 ))
  echo "== tf $v: smoke suite on 2 ranks" >>"$log"
  work=$(mktemp -d)
  # Run from an empty folder: the installed bluefog is imported, not the checkout's sources.
  (cd "$work" && timeout "$SMOKE_TIMEOUT" mpirun --bind-to none -np 2 \
     "$REPO/tests/mpi_pytest.sh" "$venv/bin/python" --rootdir "$REPO" -c "$REPO/pyproject.toml" \
     "${SMOKE[@]/#/$REPO/}" -x) >>"$log" 2>&1
  rc=$?
  rm -rf "$work"
  [ "$v" != "$first" ] && [ "$v" != "$last" ] && drop "$v"
  summary=$(grep -E '^[0-9]+ passed|passed|failed' "$log" | tail -n 1)
  secs=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    result[$v]="ok   tensorflow-cpu $tf_version, keras $keras_version: $summary (install ${built}s, total ${secs}s)"
  else
    result[$v]="FAIL tensorflow-cpu $tf_version, keras $keras_version: smoke suite exit $rc: $summary; see $log"
  fi
done
wait 2>/dev/null

# Version skew: the first entry's TensorFlow importing the last entry's build of bluefog (needs
# two entries of different releases), or, with TF_SKEW_PYTHON (a Python whose environment has
# another TensorFlow and bluefog built for it, e.g. the dev venv's), that one's build.
skew="skipped (needs two releases, or TF_SKEW_PYTHON)"
skew_python=""
if [ -n "${TF_SKEW_PYTHON:-}" ]; then
  skew_python=$TF_SKEW_PYTHON
elif [ -n "$first" ] && [ -f "$(venv_of "$last")/.bluefog-sdist" ]; then
  skew_python=$(venv_of "$last")/bin/python
fi
if [ -n "$skew_python" ] && [ -f "$(venv_of "$first")/.bluefog-sdist" ]; then
  # (From / so that the installed package is found, not the checkout's sources.)
  skew_pkg=$(cd / && "$skew_python" -c 'import os, bluefog; print(os.path.dirname(bluefog.__file__))' 2>/dev/null)
  skew_tf=$(cd / && "$skew_python" -c 'import tensorflow as tf; print(".".join(tf.__version__.split(".")[:2]))' 2>/dev/null)
fi
if [ -n "$skew_python" ] && [ -n "${skew_pkg:-}" ] && [ "${skew_tf:-}" != "${first%%:*}" ]; then
  other=$(mktemp -d)
  ln -s "$skew_pkg" "$other/bluefog"
  msg=$(cd "$other" && "$(venv_of "$first")/bin/python" -c "import bluefog.tensorflow" 2>&1 | tail -n 1)
  rm -rf "$other"
  if [[ "$msg" == *"ImportError: bluefog was built against TensorFlow $skew_tf"*"pip install --no-build-isolation"* ]]; then
    skew="ok   (TensorFlow ${first%%:*} importing a build for $skew_tf: $msg)"
  else
    skew="FAIL (TensorFlow ${first%%:*} importing a build for $skew_tf said: $msg)"
  fi
fi
for v in "$first" "$last"; do [ -n "$v" ] && drop "$v"; done

# An unsupported TensorFlow: the documented install must stop with one clear message.
unsupported="skipped (TF_UNSUPPORTED is empty)"
if [ -n "$UNSUPPORTED" ]; then
  wait "$prep_pid" 2>/dev/null
  venv=$(venv_of "$UNSUPPORTED")
  if [ ! -f "$venv/.ready" ]; then
    unsupported="FAIL (installing tensorflow-cpu==$UNSUPPORTED.*; see $(log_of "$UNSUPPORTED"))"
  else
    out=$("$venv/bin/pip" install --no-build-isolation --no-cache-dir --no-deps "$SDIST" 2>&1)
    rc=$?
    echo "$out" >>"$(log_of "$UNSUPPORTED")"
    msg=$(echo "$out" | tr -s ' \n' ' ' | grep -o "bluefog: TensorFlow $UNSUPPORTED[.0-9]* is installed, but bluefog supports TensorFlow 2.16 to 2.21" | head -n 1)
    if [ $rc -ne 0 ] && [ -n "$msg" ]; then
      unsupported="ok   (refused: $msg...)"
    else
      unsupported="FAIL (pip exit $rc; see $(log_of "$UNSUPPORTED"))"
    fi
  fi
  drop "$UNSUPPORTED"
fi

echo
echo "TensorFlow matrix ($(( $(date +%s) - start ))s wall):"
status=0
for v in "${versions[@]}"; do
  echo "  $v: ${result[$v]}"
  [[ "${result[$v]}" == ok* ]] || status=1
done
echo "  version skew: $skew"
[[ "$skew" == ok* ]] || status=1
echo "  unsupported ${UNSUPPORTED:-version}: $unsupported"
[[ "$unsupported" == ok* || "$unsupported" == skipped* ]] || status=1
exit $status
