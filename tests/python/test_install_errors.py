"""The install's and the import's clear errors: building without TensorFlow, and importing an op
library built against another TensorFlow.

make test-tf-matrix covers the real cross-version case (TensorFlow 2.16 importing a build for
2.21); here the same check runs on a copy of this environment's library whose record names
another version, and the configure step runs with a Python whose environment has no TensorFlow.
"""

import glob
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from bluefog.common import library
from bluefog.tensorflow import compat

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CMAKE = shutil.which("cmake", path=os.path.dirname(sys.executable)) or shutil.which("cmake")


def test_the_installed_library_records_this_tensorflow():
    assert compat.built_against(library.library_dir()) == tf.__version__


def _copy_of_library(tmp_path, recorded):
    lib = tmp_path / "lib"
    shutil.copytree(library.library_dir(), lib)
    if recorded is None:
        os.remove(lib / compat.BUILD_INFO)
    else:
        (lib / compat.BUILD_INFO).write_text(recorded + "\n")
    return str(lib)


def test_import_with_another_tensorflow_says_to_rebuild(tmp_path):
    lib = _copy_of_library(tmp_path, "2.16.2" if tf.__version__ != "2.16.2" else "2.21.0")
    with pytest.raises(ImportError) as e:
        compat.load_ops(lib)
    message = str(e.value)
    assert "built against TensorFlow" in message and tf.__version__ in message
    assert "pip install --no-build-isolation" in message


def test_import_without_a_build_record_says_to_rebuild(tmp_path):
    with pytest.raises(ImportError, match="Rebuild it in this environment: pip install"):
        compat.load_ops(_copy_of_library(tmp_path, None))


@pytest.mark.skipif(CMAKE is None, reason="cmake not installed")
def test_configure_without_tensorflow_names_what_to_install(tmp_path):
    # An environment as a user might have it: a plain venv, no TensorFlow.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                   check=True)
    python = tmp_path / "venv" / "bin" / "python"
    result = subprocess.run([CMAKE, "-S", REPO, "-B", str(tmp_path / "build"),
                             f"-DPython3_EXECUTABLE={python}"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    out = " ".join((result.stdout + result.stderr).split())
    assert "cannot import tensorflow" in out, out[-2000:]
    assert "pip install 'tensorflow-cpu>=2.16,<2.22'" in out, out[-2000:]
    assert "No module named 'tensorflow'" in out, out[-2000:]


MPI_DIR = "/usr/lib/x86_64-linux-gnu/openmpi"


GLOO_HEADERS = "/usr/include/gloo"
GLOO_LIBRARY = "/usr/lib/libgloo.so"


def _configure_hiding(tmp_path, hide_gloo: bool):
    """Configures the C++ core in a private mount namespace where Debian's Open MPI folder
    (headers, libraries) is an empty tmpfs and the wrappers are empty files; with `hide_gloo`,
    Gloo's headers and library are hidden too. Returns (returncode, output)."""
    hide = [f"mount -t tmpfs none {MPI_DIR}"] + [
        f"mount --bind /dev/null {w}" for w in ("/usr/bin/mpicc", "/usr/bin/mpicxx",
                                               "/usr/bin/mpirun") if os.path.exists(w)]
    if hide_gloo:
        hide += [f"mount -t tmpfs none {GLOO_HEADERS}"] + [
            f"mount --bind /dev/null {lib}" for lib in glob.glob(GLOO_LIBRARY + "*")]
    script = " && ".join(hide + [f"'{CMAKE}' -S '{REPO}' -B '{tmp_path}/build' "
                                 "-DBLUEFOG_BUILD_TF=OFF -DBLUEFOG_BUILD_TESTS=OFF"])
    result = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True,
                            text=True, timeout=120)
    out = " ".join((result.stdout + result.stderr).split())
    if "unshare failed" in out or "mount: " in out:
        pytest.skip(f"cannot make a mount namespace here: {out[-300:]}")
    return result.returncode, out


needs_hiding = pytest.mark.skipif(
    CMAKE is None or os.geteuid() != 0 or not shutil.which("unshare")
    or not os.path.isdir(MPI_DIR),
    reason="hiding Open MPI needs cmake, root, unshare and Debian's Open MPI layout")


@needs_hiding
@pytest.mark.skipif(not os.path.isdir(GLOO_HEADERS), reason="libgloo-dev is not installed")
def test_configure_without_mpi_builds_gloo_only(tmp_path):
    """MPI is optional: without it the core configures with the Gloo backend alone, and says
    what to install for MPI."""
    code, out = _configure_hiding(tmp_path, hide_gloo=False)
    assert code == 0, out[-2000:]
    assert "MPI not found" in out and "libopenmpi-dev openmpi-bin" in out, out[-2000:]
    assert "building the Gloo backend" in out, out[-2000:]


@needs_hiding
def test_configure_without_any_backend_names_the_packages(tmp_path):
    code, out = _configure_hiding(tmp_path, hide_gloo=True)
    assert code != 0
    assert "neither MPI" in out and "nor Gloo" in out, out[-2000:]
    assert "apt-get install libopenmpi-dev openmpi-bin" in out, out[-2000:]
    assert "libgloo-dev" in out, out[-2000:]
