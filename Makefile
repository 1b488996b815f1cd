# The two commands a fresh machine needs: `make demo` and `make test`. Everything they need is
# installed by the targets below: Open MPI and GoogleTest from Debian, the rest into .venv.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2
MPIRUN := mpirun --bind-to none
# Upper bound for one multi-rank pytest run, so that a hang fails instead of blocking CI.
TEST_TIMEOUT ?= 900
SOURCES := $(shell find csrc bluefog -name '*.cc' -o -name '*.h' -o -name '*.py') CMakeLists.txt pyproject.toml

.PHONY: all deps build cpp-build demo test test-cpp test-no-mpi test-python lint sanitize \
	sanitize-ci stress soak flood fuzz-launch bench bench-horovod bench-gloo clean sdist docs \
	test-gloo browser-deps test-nightly \
	test-tf-matrix test-tf-matrix-ci slurm-deps test-slurm test-bluefog-examples

all: build

# System packages: Open MPI (compilers, mpirun), Gloo (the backend for jobs started without
# mpirun) and GoogleTest. Installed only when missing.
deps: $(VENV)/.deps-stamp
$(VENV)/.deps-stamp: requirements.txt
	@if ! command -v mpicxx >/dev/null || ! command -v mpirun >/dev/null || [ ! -f /usr/include/gtest/gtest.h ] || \
	    [ ! -f /usr/include/gloo/allreduce.h ]; then \
	  echo "Installing Open MPI, Gloo and GoogleTest from Debian..."; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    openmpi-bin libopenmpi-dev libgloo-dev libgtest-dev >/dev/null || { \
	    echo "Could not install openmpi-bin libopenmpi-dev libgloo-dev libgtest-dev; install them by hand."; exit 1; }; \
	fi
	@# The eager calls' extension module needs Python's headers (Debian's python3-dev for its
	@# own Python; a Python built from source, pyenv's included, has them).
	@if [ ! -f "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
	  echo "Installing Python's development headers from Debian..."; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    python3-dev >/dev/null || { echo "Could not install python3-dev; install it by hand."; exit 1; }; \
	fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# Not quiet: TensorFlow and Ray take minutes to download the first time, and pip's lines
	@# (progress bars at a terminal) show that it moves. Later runs skip this (the stamp).
	@echo "Installing the Python packages of requirements.txt into $(VENV) (a few minutes the first time)..."
	$(PY) -m pip install -r requirements.txt
	@touch $@

# The package (C++ core + TF ops + Python) built with CMake through scikit-build-core and
# installed into .venv. Incremental: the CMake build folder lives in build/.
build: $(VENV)/.build-stamp
$(VENV)/.build-stamp: $(VENV)/.deps-stamp $(SOURCES)
	@# The distribution was called "bluefog" before it became "bluefog-tf": drop the old record.
	@if $(PY) -m pip show -q bluefog >/dev/null 2>&1; then $(PY) -m pip uninstall -q -y bluefog; fi
	$(PY) -m pip install -q --no-build-isolation --no-deps .
	@touch $@

# The documentation site (mkdocs.yml): guides, the API reference generated from the docstrings
# and `bfrun --help`, built into build/docs with every warning an error. mkdocstrings reads the
# sources without importing them, so no build of the package is needed.
# Built again only when one of its inputs changed (the guides, mkdocs.yml, the package's
# sources for the docstrings and `bfrun --help`): CI's docs stage and `make test` build it once.
DOCS_INPUTS := mkdocs.yml $(shell find docs bluefog -type f -not -path '*/__pycache__/*' 2>/dev/null)
docs: build/.docs-built
build/.docs-built: $(VENV)/.docs-stamp $(DOCS_INPUTS)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@touch $@

$(VENV)/.docs-stamp: $(VENV)/.deps-stamp docs/requirements.txt
	$(PY) -m pip install -q -r docs/requirements.txt
	@touch $@

demo: build
	$(MPIRUN) -np 2 $(PY) examples/keras_digits.py

test: build test-cpp test-python

cpp-build: $(VENV)/.deps-stamp
	$(VENV)/bin/cmake -S . -B build/cpp -G Ninja -DBLUEFOG_BUILD_TF=OFF -DBLUEFOG_BUILD_TESTS=ON \
	  -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) >/dev/null
	$(VENV)/bin/ninja -C build/cpp

test-cpp: cpp-build
	cd build/cpp && PATH=$(abspath $(VENV)/bin):$$PATH $(abspath $(VENV)/bin/ctest) --output-on-failure --timeout 300

# A build without MPI (-DBLUEFOG_WITH_MPI=OFF: the C++ core and its tests, Gloo only) in a
# folder of its own, and its Gloo ctests: proves the core builds and runs where MPI is absent.
# CI runs the ones that differ from `make test`'s (where the same Gloo tests run against the
# MPI build): the core's, no_mpi, and Gloo's transport and one-host paths at 3 ranks;
# NO_MPI_TESTS= NO_MPI_TARGETS= builds and runs every one.
NO_MPI_TESTS ?= -R '^(core_tests|no_mpi|gloo_transport_np3|local_transport_gloo_np3)$$'
NO_MPI_TARGETS ?= core_tests no_mpi_tests gloo_transport_tests local_transport_tests
test-no-mpi: $(VENV)/.deps-stamp
	$(VENV)/bin/cmake -S . -B build/no-mpi -G Ninja -DBLUEFOG_BUILD_TF=OFF -DBLUEFOG_BUILD_TESTS=ON \
	  -DBLUEFOG_WITH_MPI=OFF -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) >/dev/null
	$(VENV)/bin/ninja -C build/no-mpi $(NINJAFLAGS) $(NO_MPI_TARGETS)
	@if nm -D --undefined-only build/no-mpi/libbluefog_core.so | grep -q ' MPI_'; then \
	  echo "build/no-mpi/libbluefog_core.so refers to MPI"; exit 1; fi
	cd build/no-mpi && PATH=$(abspath $(VENV)/bin):$$PATH $(abspath $(VENV)/bin/ctest) \
	  --output-on-failure --timeout 300 $(NO_MPI_TESTS)

# Debian's chromium, for the documentation site's browser test (tests/python/test_site_browser.py,
# through Playwright's Python package, which downloads no browser). Installed only when missing;
# where it cannot be, the test is skipped and says why (and fails under CI).
browser-deps:
	@if ! command -v chromium >/dev/null; then \
	  echo "Installing chromium from Debian (the site's browser test)..."; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    chromium >/dev/null || echo "Could not install chromium; install it by hand, or the" \
	    "site's browser test is skipped."; \
	fi

# Single-process tests (some start mpirun jobs of their own: bfrun, faults, timeline, stalls,
# stress, fuzzing; the site in a browser, hence docs and browser-deps) but those marked nightly,
# with the slowest printed, then the TF suite on 2 and 4 ranks.
# PYTEST_DURATIONS: how many of the slowest tests to print (20).
PYTEST_DURATIONS ?= 20
test-python: build docs browser-deps
	$(PY) -m pytest -q tests/python --ignore=tests/python/mpi -m "not nightly" \
	  --durations=$(PYTEST_DURATIONS)
	$(call mpi_suites,2 4)

# The TF suite under mpirun on each rank count of $(1).
define mpi_suites
	for n in $(1); do \
	  echo "== pytest under mpirun -np $$n =="; \
	  timeout $(TEST_TIMEOUT) $(MPIRUN) -np $$n tests/mpi_pytest.sh $(PY) tests/python/mpi || exit 1; \
	done
endef

# What `make test` leaves out: the tests marked nightly (long runs of cases the quicker tests
# cover: the launch fuzzer's sample, the stranger flood, ...) and the TF suite on 1 and 3 ranks.
test-nightly: build docs browser-deps
	$(PY) -m pytest -q tests/python --ignore=tests/python/mpi -m nightly --durations=20
	$(call mpi_suites,1 3)

# Bluefog's examples ported to TensorFlow (examples/bluefog/) at 4 ranks, with the slow MNIST
# runs that `make test` leaves out.
test-bluefog-examples: build
	BLUEFOG_SLOW_EXAMPLES=1 $(PY) -m pytest -q tests/python/test_bluefog_examples.py

# The TF suite on the Gloo backend (no mpirun: MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE) on 2 and
# 3 ranks, windows included. Then the launchers, with the digits example under bfrun --gloo
# against mpirun, and in-place elastic training's slower cases (a joining worker, below
# --min-np).
test-gloo: build
	BLUEFOG_TEST_GLOO_DIGITS=1 $(PY) -m pytest -q tests/python/test_gloo_launch.py
	BLUEFOG_TEST_GLOO_ELASTIC=1 $(PY) -m pytest -q tests/python/test_elastic_inplace.py \
	  tests/python/test_horovod_elastic_examples.py tests/python/test_ray_elastic.py
	for n in 2 3; do \
	  echo "== pytest on Gloo, $$n ranks =="; \
	  $(PY) tests/python/gloo_jobs.py -np $$n --timeout $(TEST_TIMEOUT) -- \
	    tests/mpi_pytest.sh $(PY) tests/python/mpi || exit 1; \
	done

# Static checks: ruff over the Python (rules in pyproject.toml's [tool.ruff]).
# ruff for the Python, clang-format (.clang-format at the root) for the C++.
lint: $(VENV)/.deps-stamp
	$(VENV)/bin/ruff check bluefog tests examples bench docs
	$(VENV)/bin/clang-format --dry-run --Werror $$(git ls-files '*.cc' '*.h' 2>/dev/null || \
	  find csrc tests bench -name '*.cc' -o -name '*.h')

# The C++ core's tests under AddressSanitizer + UndefinedBehaviorSanitizer, then ThreadSanitizer.
sanitize: $(VENV)/.deps-stamp
	PATH=$(abspath $(VENV)/bin):$$PATH tests/sanitize.sh

# What CI runs: the same two builds, each over a subset of the ctest jobs that still covers every
# family of code paths under at least one sanitizer (the list and the reasons: tests/sanitize.sh).
sanitize-ci: $(VENV)/.deps-stamp
	PATH=$(abspath $(VENV)/bin):$$PATH tests/sanitize.sh --ci

# The long randomized run (10,000 collectives on 3 ranks, every result checked).
stress: build
	timeout 1800 $(MPIRUN) -np 3 $(PY) tests/stress/stress_collectives.py --count 10000

# Five minutes of process sets, windows and elastic commits cycled on 3 ranks, with memory,
# descriptors, threads and state files checked (tests/stress/soak_state.py).
soak: build
	timeout 600 $(MPIRUN) -np 3 $(PY) tests/stress/soak_state.py --seconds 300

# A stranger's flood of 10,000 connections (garbage, idle, slow-drip, wrong-token) against rank
# 0's rendezvous server during a 3-rank Gloo job and against the store of an in-place elastic
# job (tests/python/test_flood.py, which `make test-nightly` runs with 400); prints each listener's
# descriptors and threads before, at the peak and after.
flood: build
	BLUEFOG_FLOOD_COUNT=10000 timeout 1200 $(PY) -m pytest -q -s tests/python/test_flood.py \
	  tests/python/test_ibfrun.py -k "flood"

# The bench targets also write their results as data files into $(BENCH_OUT) (the format:
# bench/results.py; docs/data/ holds the published ones, drawn by `make docs`).
BENCH_OUT ?= build/bench/results

# The launch fuzzer's 500 cases (torchrun's variables, TF_CONFIG, BLUEFOG_*/HOROVOD_* settings
# and bfrun's options at 2-3 processes; `make test-nightly` runs a daily sample of 60). It prints its
# seed first: FUZZ_SEED=S repeats a run.
FUZZ_SEED ?=
fuzz-launch: build
	$(PY) tests/fuzz/fuzz_launch.py --cases 500 $(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

bench: build cpp-build
	$(PY) bench/run.py --out $(BENCH_OUT)/run.json

# bluefog against Horovod 0.28.1 (built once into ~/.cache/bluefog with tensorflow-cpu 2.15):
# eager and tf.function allreduce 4 B - 64 MiB, and training steps; interleaved launches.
bench-horovod: build
	$(PY) bench/vs_horovod.py --out $(BENCH_OUT)/vs_horovod.json

# bf.allreduce 64 KiB-64 MiB at 2 and 3 ranks: bfrun --gloo against mpirun, launches interleaved.
bench-gloo: build
	$(PY) bench/gloo_vs_mpi.py --out $(BENCH_OUT)/gloo_vs_mpi.json

# The source distribution (dist/bluefog_tf-<version>.tar.gz). It needs only `build` and the
# build backend, in a small venv of its own (build/sdist-venv), not the dev environment: no
# TensorFlow, no compiler (examples/kubernetes/Dockerfile compiles it).
SDIST_VENV ?= build/sdist-venv
sdist: $(SDIST_VENV)/.stamp
	rm -rf dist && $(SDIST_VENV)/bin/python -m build --sdist --no-isolation --outdir dist . \
	  >/dev/null && ls dist/*.tar.gz

$(SDIST_VENV)/.stamp:
	@[ -x $(SDIST_VENV)/bin/python ] || $(PYTHON) -m venv $(SDIST_VENV)
	$(SDIST_VENV)/bin/python -m pip install -q build 'scikit-build-core>=0.8'
	@touch $@

# Every supported TensorFlow (2.16 ... 2.21, the cpu wheels): a fresh venv each under
# build/tf-matrix, bluefog installed from the sdist with the documented pip command, and the
# smoke suite on 2 ranks. Venvs are kept, so a rerun only reinstalls bluefog.
test-tf-matrix: sdist
	tests/tf_matrix/run.sh dist/*.tar.gz

# What CI runs: the oldest release with the Keras of its time (make test covers the newest, in
# .venv), TensorFlow 2.16 importing .venv's build for 2.21 (the "rebuild" check), and the
# unsupported 2.15 as in the full matrix. The venvs are removed as soon as no later check needs
# them (CI's disk is not ours to fill).
TF_CI_VERSIONS ?= 2.16:keras==3.3.3
test-tf-matrix-ci: sdist
	TF_VERSIONS="$(TF_CI_VERSIONS)" TF_MATRIX_KEEP=0 TF_SKEW_PYTHON=$(abspath $(PY)) \
	  tests/tf_matrix/run.sh dist/*.tar.gz

# Slurm and munge from Debian, for the Slurm test (which starts and stops its own daemons).
slurm-deps:
	@if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/munged ] || \
	    ! command -v sbatch >/dev/null; then \
	  echo "Installing slurm-wlm and munge from Debian..."; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    slurm-wlm munge >/dev/null || { echo "Could not install slurm-wlm munge; install them by hand."; exit 1; }; \
	fi

# The digits example through sbatch (mpirun and bfrun inside the allocation) and srun, on a
# one-node Slurm the test brings up on this machine. Needs root (skipped otherwise).
test-slurm: build slurm-deps
	timeout $(TEST_TIMEOUT) $(PY) -m pytest -q -p no:cacheprovider tests/slurm

clean:
	rm -rf build $(VENV)/.build-stamp
