"""Horovod's TF2 Keras MNIST example (examples/tensorflow2/tensorflow2_keras_mnist.py), ported
to bluefog: the same calls with the same arguments, in the same order.

    bfrun -np 2 -H localhost:2 python tensorflow2_keras_mnist.py

What differs from Horovod's script, line by line:
- the imports (``horovod`` -> ``bluefog``, ``horovod.tensorflow.keras`` ->
  ``bluefog.tensorflow.keras``);
- the data: ``local_mnist.load_data`` (MNIST-shaped, made here) instead of the MNIST download;
- ``compile(..., experimental_run_tf_function=False)`` loses that argument (Keras 3 refuses
  it; bluefog's DistributedOptimizer needs nothing of the kind);
- ``HVD_EXAMPLE_STEPS`` (default 500, Horovod's number: steps per epoch over all ranks) and
  ``HVD_EXAMPLE_EPOCHS`` (default 24), so that a test can run a short training.
"""

import os
import sys

import local_mnist
import tensorflow as tf

import bluefog
import bluefog.tensorflow.keras as hvd


def main():
    hvd.init()

    # One GPU per process, chosen by the local rank (nothing to do on a CPU-only machine).
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    (mnist_images, mnist_labels), _ = local_mnist.load_data(path=f"mnist-{hvd.rank()}.npz")

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
         tf.cast(mnist_labels, tf.int64)))
    dataset = dataset.repeat().shuffle(10000).batch(128)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])

    # The learning rate grows with the number of ranks (the global batch grows with it).
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # The wrapped optimizer averages the gradients over the ranks before applying them.
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=["accuracy"])

    callbacks = [
        # Every rank starts from rank 0's weights (also after restoring a checkpoint).
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),

        # The epoch's metrics become their average over the ranks. Keep it before callbacks
        # that read the metrics (ReduceLROnPlateau, TensorBoard, ...).
        hvd.callbacks.MetricAverageCallback(),

        # The scaled learning rate is reached gradually over the first three epochs rather
        # than used from the first step (Goyal et al., 2017, arXiv:1706.02677).
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3,
                                                 verbose=1),
    ]

    # Only rank 0 writes checkpoints, so that ranks do not overwrite each other's files.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint("./checkpoint-{epoch}.h5"))

    # Only rank 0 prints the progress.
    verbose = 1 if hvd.rank() == 0 else 0

    # Each rank takes its share of the steps of an epoch.
    steps = int(os.environ.get("HVD_EXAMPLE_STEPS", "500"))
    epochs = int(os.environ.get("HVD_EXAMPLE_EPOCHS", "24"))
    mnist_model.fit(dataset, steps_per_epoch=steps // hvd.size(), callbacks=callbacks,
                    epochs=epochs, verbose=verbose)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        # python tensorflow2_keras_mnist.py NP HOSTS gloo|mpi: start the ranks from here.
        np = int(sys.argv[1])
        hosts = sys.argv[2]
        comm = sys.argv[3]
        print("Running training through bluefog.run")
        bluefog.run(main, np=np, hosts=hosts, use_gloo=comm == "gloo",
                    use_mpi=comm == "mpi")
    else:
        # Started by bfrun (or mpirun): this process is one rank.
        main()
