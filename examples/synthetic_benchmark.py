"""Training throughput on synthetic images: images/second per rank and in total.

    python examples/synthetic_benchmark.py                     # 1 rank
    bfrun -np 2 python examples/synthetic_benchmark.py         # 2 ranks

A small CNN on random 32x32x3 images (nothing to download), trained with a
DistributedGradientTape in a tf.function, so each step includes the gradient allreduce
(--compression fp16|bf16 sends the gradients in 16 bits). Timing: --num-warmup-batches untimed
steps, then --num-iters timed iterations of --num-batches-per-iter steps each; it prints the
mean and 95% interval of images/sec.
"""

import argparse
import os
import sys
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import bluefog.tensorflow as bf

bf.init()
tf.config.threading.set_intra_op_parallelism_threads(
    max(1, (os.cpu_count() or 1) // bf.local_size()))
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32, help="images per step per rank")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--width", type=int, default=32, help="filters of the first conv layer")
    p.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none",
                   help="send the gradients in 16 bits (pays across slow networks)")
    return p.parse_args()


def make_model(image_size, width):
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(4 * width, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


def log(text):
    if bf.rank() == 0:
        print(text, flush=True)


def main():
    args = parse_args()
    rank, size = bf.rank(), bf.size()
    keras.utils.set_random_seed(rank)
    model = make_model(args.image_size, args.width)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)
    bf.broadcast_variables(model.weights + optimizer.variables, root_rank=0)

    rs = np.random.RandomState(rank)
    images = tf.constant(rs.uniform(size=(args.batch_size, args.image_size, args.image_size, 3))
                         .astype(np.float32))
    labels = tf.constant(rs.randint(0, 10, size=(args.batch_size,)).astype(np.int64))

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = bf.DistributedGradientTape(
            tape, compression=getattr(bf.Compression, args.compression))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def run(steps):
        for _ in range(steps):
            loss = train_step()
        loss.numpy()  # wait for the last step

    n_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    log(f"model: small CNN, {n_params} parameters; batch size {args.batch_size} per rank; "
        f"{size} rank(s); compression {args.compression}")
    run(args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(lambda: run(args.num_batches_per_iter), number=1)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        rates.append(rate)
        log(f"iter {i}: {rate:.1f} img/sec per rank")
    mean, conf = float(np.mean(rates)), 1.96 * float(np.std(rates))
    # Every rank's own rate, summed: the total throughput of the job.
    total = float(bf.allreduce(tf.constant([mean], tf.float64), average=False,
                               name="synthetic_benchmark.total").numpy()[0])
    log(f"img/sec per rank: {mean:.1f} +- {conf:.1f}")
    log(f"total img/sec on {size} rank(s): {total:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
