"""Horovod's TF2 synthetic benchmark (examples/tensorflow2/tensorflow2_synthetic_benchmark.py),
ported to bluefog: the same flags, calls and output lines.

    bfrun -np 2 -H localhost:2 python tensorflow2_synthetic_benchmark.py --no-cuda

It trains a ``tf.keras.applications`` model (``--model``, default ResNet50) on one random batch
of 224x224 images, and prints images/second per rank and in total. What differs from
Horovod's script: the import (``horovod`` -> ``bluefog``) and ``opt.variables()`` ->
``opt.variables`` (Keras 3 made it a property).
"""

import argparse
import os
import timeit

import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

import bluefog.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="send the gradients in 16-bit floats")

parser.add_argument("--model", type=str, default="ResNet50",
                    help="the tf.keras.applications model to train")
parser.add_argument("--batch-size", type=int, default=32,
                    help="images per step and rank")

parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="steps before timing starts")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="steps per timed iteration")
parser.add_argument("--num-iters", type=int, default=10,
                    help="timed iterations")

parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="train on the CPU")

args = parser.parse_args()
args.cuda = not args.no_cuda

hvd.init()

# One GPU per process, chosen by the local rank; --no-cuda hides the GPUs.
if args.cuda:
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

model = getattr(applications, args.model)(weights=None)
opt = tf.optimizers.SGD(0.01)

data = tf.random.uniform([args.batch_size, 224, 224, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)


@tf.function
def benchmark_step(first_batch):
    # The gradients travel in 16 bits with --fp16-allreduce.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)

    # The wrapped tape averages the gradients over the ranks.
    tape = hvd.DistributedGradientTape(tape, compression=compression)

    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))

    # Every rank starts from rank 0's weights and optimizer state. This runs after the first
    # step, once the optimizer has created its variables.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "")


log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
device = "GPU" if args.cuda else "CPU"
log(f"Number of {device}s: {hvd.size()}")


with tf.device(device):
    log("Running warmup...")
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False),
                  number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(lambda: benchmark_step(first_batch=False),
                             number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)

    # The mean and a 95% interval, per rank and for all ranks together.
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")
