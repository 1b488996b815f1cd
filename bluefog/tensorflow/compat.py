"""Everything that depends on which TensorFlow / Keras release is installed, in one place.

bluefog supports the Keras 3 releases of TensorFlow, 2.16 to 2.21 (``make test-tf-matrix`` runs
the smoke suite on each). The op library is C++ compiled against one TensorFlow's headers and
``libtensorflow_framework``, whose ABI changes between releases, so it is checked here, before
it is loaded, against the TensorFlow imported now. The README's "Supported versions" table
lists what differs between the releases and how it is handled.
"""

from __future__ import annotations

import os

import tensorflow as tf

SUPPORTED = ("2.16", "2.17", "2.18", "2.19", "2.20", "2.21")
BUILD_INFO = "tf_build_info.txt"
REBUILD = ("pip install --no-build-isolation --force-reinstall --no-deps <bluefog checkout or "
           "sdist>")


def built_against(library_dir: str) -> str:
    """The TensorFlow version the op library in ``library_dir`` was compiled against."""
    try:
        with open(os.path.join(library_dir, BUILD_INFO)) as f:
            return f.read().strip()
    except OSError:
        return ""


def load_ops(library_dir: str, name: str = "libbluefog_tf.so"):
    """``tf.load_op_library`` of bluefog's ops, after checking they match this TensorFlow."""
    installed = tf.__version__
    built = built_against(library_dir)
    if not built:
        raise ImportError(
            f"bluefog's TensorFlow op library in {library_dir} has no record of the TensorFlow it "
            f"was built against ({BUILD_INFO} is missing), so it may not load with TensorFlow "
            f"{installed}. Rebuild it in this environment: {REBUILD}")
    if built != installed:
        raise ImportError(
            f"bluefog was built against TensorFlow {built}, but TensorFlow {installed} is "
            f"installed: its compiled ops only work with the TensorFlow they were built against. "
            f"Rebuild bluefog in this environment: {REBUILD}")
    try:
        return tf.load_op_library(os.path.join(library_dir, name))
    except tf.errors.NotFoundError as e:  # an undefined symbol: the ABI does not match
        raise ImportError(
            f"bluefog's op library, built against TensorFlow {built}, does not load with the "
            f"installed TensorFlow {installed}: {e}. Rebuild bluefog in this environment: "
            f"{REBUILD}") from None
