"""MNIST-shaped data made on this machine, for the Horovod example ports (no download).

``load_data()`` answers like ``tf.keras.datasets.mnist.load_data()``: ``((x_train, y_train),
(x_test, y_test))`` with uint8 images of 28x28 pixels in 0..255 and integer labels 0..9. The
images are scikit-learn's 8x8 handwritten digits, each pixel repeated 3x3 (24x24) and framed by
2 blank pixels; 1,500 for training, the other 297 for testing.
"""

import numpy as np
from sklearn.datasets import load_digits


def load_data(path=None):
    """The local stand-in for ``tf.keras.datasets.mnist.load_data(path)``; ``path`` is
    accepted and unused (nothing is downloaded or cached)."""
    del path
    digits = load_digits()
    small = digits.images / 16.0  # (1797, 8, 8) in 0..1
    big = np.kron(small, np.ones((1, 3, 3)))  # (1797, 24, 24)
    images = np.pad(big, ((0, 0), (2, 2), (2, 2)))
    images = np.round(images * 255).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    return (images[:1500], labels[:1500]), (images[1500:], labels[1500:])
