"""Horovod's elastic TF2 Keras MNIST example
(examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py), ported to bluefog: the same
calls with the same arguments, in the same order.

    bfrun --gloo -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover_hosts.sh \\
        python tensorflow2_keras_mnist_elastic.py

What differs from Horovod's script, line by line:
- the imports (``horovod.tensorflow.keras`` -> ``bluefog.tensorflow.keras``);
- the data: ``local_mnist.load_data`` (MNIST-shaped, made here) instead of the MNIST download;
- ``compile(..., experimental_run_tf_function=False)`` loses that argument (Keras 3 refuses
  it; bluefog's DistributedOptimizer needs nothing of the kind);
- ``tf.keras.backend.set_value(state.model.optimizer.lr, x)`` ->
  ``state.model.optimizer.learning_rate = x`` (Keras 3 has neither ``set_value`` nor ``lr``);
- the checkpoint is ``checkpoint-{epoch}.keras`` (Keras 3 writes whole models only as
  ``.keras``);
- ``HVD_EXAMPLE_STEPS`` (default 500, Horovod's number: steps per epoch over all ranks) and
  ``HVD_EXAMPLE_EPOCHS`` (default 24), so that a test can run a short training.
"""

import argparse
import os

import local_mnist
import tensorflow as tf
from packaging import version

import bluefog.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description="Tensorflow 2.0 Keras MNIST Example")

parser.add_argument("--use-mixed-precision", action="store_true", default=False,
                    help="use mixed precision for training")

args = parser.parse_args()

if args.use_mixed_precision:
    if version.parse(tf.__version__) >= version.parse("2.4.0"):
        from tensorflow.keras import mixed_precision
        mixed_precision.set_global_policy("mixed_float16")
    else:
        policy = tf.keras.mixed_precision.experimental.Policy("mixed_float16")
        tf.keras.mixed_precision.experimental.set_policy(policy)

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

model = tf.keras.Sequential([
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

model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
              optimizer=opt,
              metrics=["accuracy"])

# One step creates the optimizer's variables, so that the elastic state has every variable to
# synchronize.
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    state.model.optimizer.learning_rate = 0.001 * hvd.size()
    # One step with the ranks of the new job (its collectives are traced for them).
    state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)


state.register_reset_callbacks([on_state_reset])

callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
]

# Only rank 0 writes checkpoints, so that ranks do not overwrite each other's files.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint("./checkpoint-{epoch}.keras"))

steps = int(os.environ.get("HVD_EXAMPLE_STEPS", "500"))
epochs = int(os.environ.get("HVD_EXAMPLE_EPOCHS", "24"))


# Each rank takes its share of the steps of an epoch; a resumed job runs the epochs left.
@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=steps // hvd.size(),
                    epochs=epochs - state.epoch, callbacks=callbacks,
                    verbose=1)


train(state)
