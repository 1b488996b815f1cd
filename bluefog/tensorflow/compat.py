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


def keras_variable_classes() -> tuple:
    """The classes of Keras 3 variables, for ``isinstance``.

    ``keras.Variable`` is the base of every Keras variable from Keras 3.7 on. Before (3.0 to
    3.6; TensorFlow 2.16 came with 3.0-3.3) it is a separate exported class that the variables
    Keras creates (e.g. an optimizer's learning rate) are not instances of; their base is
    ``KerasVariable``.
    """
    import keras  # Keras is imported only where it is used

    classes = [keras.Variable]
    try:
        from keras.src.backend.common import variables
    except ImportError:
        return tuple(classes)
    for name in ("KerasVariable", "Variable"):
        cls = getattr(variables, name, None)
        if isinstance(cls, type) and cls not in classes:
            classes.append(cls)
    return tuple(classes)


def is_keras_variable(value) -> bool:
    return isinstance(value, keras_variable_classes())


# Keras' gradient accumulation (``gradient_accumulation_steps``, which bluefog's
# ``backward_passes_per_step`` sets) as bluefog relies on it: from Keras 3.5 on, the update step
# clips the mean of the accumulated gradients, where bluefog averages it over ranks (so the
# steps in between communicate nothing), and ``iterations`` counts updates, not backward passes.
# Keras 3.0 to 3.4 clip every backward pass's gradients and count every pass, so Adam-like
# optimizers would not match full-batch training and every pass would communicate.
KERAS_FOR_ACCUMULATION = (3, 5)


def keras_version() -> tuple:
    import keras

    parts = []
    for part in keras.__version__.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_keras_gradient_accumulation(what: str) -> None:
    """Raises a clear error when the installed Keras accumulates gradients differently."""
    if keras_version() < KERAS_FOR_ACCUMULATION:
        import keras

        need = ".".join(map(str, KERAS_FOR_ACCUMULATION))
        raise ValueError(
            f"{what}: backward_passes_per_step (Keras' gradient_accumulation_steps) needs Keras "
            f">= {need}, but Keras {keras.__version__} is installed, whose gradient accumulation "
            f"counts and clips every backward pass. Upgrade Keras (pip install 'keras>={need}'; "
            f"every TensorFlow from 2.16 on accepts it) or use backward_passes_per_step=1.")
