"""Horovod's TF2 custom-loop MNIST example (examples/tensorflow2/tensorflow2_mnist.py),
ported to bluefog: the same calls with the same arguments, in the same order.

    bfrun -np 2 -H localhost:2 python tensorflow2_mnist.py

What differs from Horovod's script, line by line:
- the imports (``horovod`` -> ``bluefog``);
- the data: ``local_mnist.load_data`` (MNIST-shaped, made here) instead of the MNIST download;
- ``opt.variables()`` -> ``opt.variables`` (Keras 3 made it a property);
- ``HVD_EXAMPLE_STEPS`` (default 10000, Horovod's number) sets the total number of steps,
  so that a test can run a few.
"""

import os
import sys

import local_mnist
import tensorflow as tf

import bluefog
import bluefog.tensorflow as hvd


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
    loss = tf.losses.SparseCategoricalCrossentropy()

    # The learning rate grows with the number of ranks (the global batch grows with it).
    opt = tf.optimizers.Adam(0.001 * hvd.size())

    checkpoint_dir = "./checkpoints"
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # The wrapped tape averages the gradients over the ranks.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Every rank starts from rank 0's weights and optimizer state. This runs after the
        # first step, once the optimizer has created its variables.
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

        return loss_value

    # Each rank takes its share of the steps.
    total_steps = int(os.environ.get("HVD_EXAMPLE_STEPS", "10000"))
    for batch, (images, labels) in enumerate(dataset.take(total_steps // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)

        if batch % 10 == 0 and hvd.rank() == 0:
            print(f"Step #{batch}\tLoss: {loss_value:.6f}")

    # Only rank 0 writes the checkpoint, so that ranks do not overwrite each other's files.
    if hvd.rank() == 0:
        checkpoint.save(checkpoint_dir)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        # python tensorflow2_mnist.py NP HOSTS gloo|mpi: start the ranks from here.
        np = int(sys.argv[1])
        hosts = sys.argv[2]
        comm = sys.argv[3]
        print("Running training through bluefog.run")
        bluefog.run(main, np=np, hosts=hosts, use_gloo=comm == "gloo",
                    use_mpi=comm == "mpi")
    else:
        # Started by bfrun (or mpirun): this process is one rank.
        main()
