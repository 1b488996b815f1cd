"""The core's Python extension modules, loaded from the folder of the core library."""

import importlib.machinery
import importlib.util
import os

from bluefog.common import library


def load_eager_extension():
    """The ``_eager`` extension module from the folder of the core library, which is loaded
    first (with its MPI symbols global) so that the module binds to that same core. It looks
    TensorFlow up when it loads (``sys.modules["tensorflow"]``)."""
    library.load()
    folder = library.library_dir()
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_eager" + suffix)
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("bluefog.lib._eager", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ImportError(f"bluefog's extension module _eager was not found in {folder}; rebuild "
                      "the package (make build)")
