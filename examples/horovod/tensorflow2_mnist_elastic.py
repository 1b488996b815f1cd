"""Horovod's elastic TF2 custom-loop MNIST example
(examples/elastic/tensorflow2/tensorflow2_mnist_elastic.py), ported to bluefog: the same calls
with the same arguments, in the same order.

    bfrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover_hosts.sh \\
        python tensorflow2_mnist_elastic.py
    python tensorflow2_mnist_elastic.py NP MIN_NP MAX_NP HOSTS     # through bluefog.run

What differs from Horovod's script, line by line:
- the imports (``horovod`` -> ``bluefog``);
- the data: ``local_mnist.load_data`` (MNIST-shaped, made here) instead of the MNIST download;
- ``opt.lr.assign(...)`` -> ``opt.learning_rate.assign(...)`` (Keras 3 has no ``lr``);
- ``HVD_EXAMPLE_STEPS`` (default 100, Horovod's number) sets the number of steps over all
  ranks, so that a test can run a few.
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
    lr = 0.001
    opt = tf.optimizers.Adam(lr * hvd.size())

    @tf.function
    def training_step(images, labels, allreduce=True):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # The wrapped tape averages the gradients over the ranks.
        if allreduce:
            tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
        return loss_value

    # One local step creates the model's and the optimizer's variables, so that the elastic
    # state has every variable to synchronize.
    for batch_idx, (images, labels) in enumerate(dataset.take(1)):  # noqa: B007
        training_step(images, labels, allreduce=False)

    total_steps = int(os.environ.get("HVD_EXAMPLE_STEPS", "100"))

    @hvd.elastic.run
    def train(state):
        start_batch = state.batch

        # Each rank takes its share of the steps.
        for batch_idx, (images, labels) in enumerate(
                dataset.skip(state.batch).take(total_steps // hvd.size())):
            state.batch = start_batch + batch_idx
            loss_value = training_step(images, labels)

            if state.batch % 10 == 0 and hvd.rank() == 0:
                print(f"Step #{state.batch}\tLoss: {loss_value:.6f}")

            # Commit after every step: a lost rank costs at most one step.
            state.commit()

    def on_state_reset():
        opt.learning_rate.assign(lr * hvd.size())

    state = hvd.elastic.TensorFlowKerasState(mnist_model, opt, batch=0)
    state.register_reset_callbacks([on_state_reset])

    train(state)

    checkpoint_dir = "./checkpoints"
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    # Only rank 0 writes the checkpoint, so that ranks do not overwrite each other's files.
    if hvd.rank() == 0:
        checkpoint.save(checkpoint_dir)


if __name__ == "__main__":
    if len(sys.argv) == 5:
        # python tensorflow2_mnist_elastic.py NP MIN_NP MAX_NP HOSTS: start the workers here.
        num_proc = int(sys.argv[1])
        min_num_proc = int(sys.argv[2])
        max_num_proc = int(sys.argv[3])
        hosts = sys.argv[4]
        print("Running training through bluefog.run")
        bluefog.run(main, num_proc=num_proc, min_num_proc=min_num_proc,
                    max_num_proc=max_num_proc, hosts=hosts, use_gloo=True, verbose=2)
    else:
        # Started by bfrun: this process is one worker.
        main()
