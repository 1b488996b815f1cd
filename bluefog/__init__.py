"""bluefog: allreduce-based and decentralized distributed training for TensorFlow over MPI."""

__version__ = "0.1.0"
