"""bluefog: allreduce-based and decentralized distributed training for TensorFlow over MPI."""

__version__ = "0.1.0"

from bluefog import run  # noqa: E402,F401 - bluefog.run(fn, np=N): see bluefog/run/runner.py
