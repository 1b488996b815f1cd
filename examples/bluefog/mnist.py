"""Bluefog's MNIST example (examples/pytorch_mnist.py) on TensorFlow / Keras 3.

    bfrun -np 4 python examples/bluefog/mnist.py                              # neighbor_allreduce
    bfrun -np 4 python examples/bluefog/mnist.py --dist-optimizer win_put
    bfrun -np 4 python examples/bluefog/mnist.py --dist-optimizer allreduce --atc-style

Each rank trains the same small convolutional network on its own shard of the data with a
decentralized optimizer. With the default dynamic topology the script sets Bluefog's per-step
knobs on the optimizer before every batch: ``optimizer.dst_weights``, ``src_weights`` and
``self_weight`` from the one-peer exponential graph for ``neighbor_allreduce``; for
``win_put`` (from the third epoch) ``optimizer.dst_weights = {one out-neighbour: 1.0}``, so each
step puts the weights into one neighbour's window only. Rank 0 prints the training loss every
``--log-interval`` batches and, after each epoch, the test loss and accuracy averaged over the
ranks (``Test set: Average loss: ..., Accuracy: ...%``); the accuracy passes 80% within a few
epochs.

The port keeps Bluefog's script and changes only the framework calls, and the data: MNIST needs
a download, so scikit-learn's bundled 8x8 digits stand in for it (each rank takes every
size-th sample, as torch's DistributedSampler does), with 3x3 instead of 5x5 convolutions to
fit them. The model is a ``keras.Sequential`` trained in an eager ``tf.GradientTape`` loop
(``optimizer.apply_gradients``), torch's ``broadcast_parameters`` /
``broadcast_optimizer_state`` became ``bf.broadcast_variables``, the log-softmax is taken over
the classes, and the Horovod branch and CUDA settings are gone.
"""

import argparse
import os
import warnings

warnings.simplefilter('ignore')
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import topology_util  # noqa: E402

# Training settings
parser = argparse.ArgumentParser(description="TensorFlow MNIST Example")
parser.add_argument(
    "--batch-size", type=int, default=64,
    metavar="N", help="input batch size for training (default: 64)")
parser.add_argument(
    "--test-batch-size", type=int, default=1000,
    metavar="N", help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=10, metavar="N",
                    help="number of epochs to train (default: 10)")
parser.add_argument(
    "--lr", type=float, default=0.001, metavar="LR", help="learning rate (default: 0.001)")
parser.add_argument('--dist-optimizer', type=str, default='neighbor_allreduce',
                    help='The type of distributed optimizer. Supporting options are ' +
                    '[neighbor_allreduce, hierarchical_neighbor_allreduce, allreduce, ' +
                    'gradient_allreduce, win_put]')
parser.add_argument('--disable-dynamic-topology', action='store_true',
                    default=False, help=('Disable each iteration to transmit one neighbor ' +
                                         'per iteration dynamically.'))
parser.add_argument('--atc-style', action='store_true', default=False,
                    help='If True, the step of optimizer happened before communication')

parser.add_argument(
    "--seed", type=int, default=42, metavar="S", help="random seed (default: 42)"
)
parser.add_argument(
    "--log-interval",
    type=int,
    default=10,
    metavar="N",
    help="how many batches to wait before logging training status",
)

args = parser.parse_args()
keras.utils.set_random_seed(args.seed)

bf.init()

# The digits instead of MNIST; each rank takes every size-th sample (DistributedSampler).
digits = load_digits()
images = (digits.images[..., None] / 16.0 - 0.3) / 0.4
x_train, x_test, y_train, y_test = train_test_split(
    images.astype(np.float32), digits.target, test_size=0.2, random_state=0)
train_x, train_y = x_train[bf.rank()::bf.size()], y_train[bf.rank()::bf.size()]
test_x, test_y = x_test[bf.rank()::bf.size()], y_test[bf.rank()::bf.size()]


def train_loader(epoch):
    order = np.random.default_rng(args.seed + epoch).permutation(len(train_x))
    for start in range(0, len(order), args.batch_size):
        idx = order[start:start + args.batch_size]
        yield train_x[idx], train_y[idx]


def Net():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(10, kernel_size=3),
        keras.layers.MaxPooling2D(2),
        keras.layers.ReLU(),
        keras.layers.Conv2D(20, kernel_size=3, padding="same"),
        keras.layers.SpatialDropout2D(0.5),
        keras.layers.MaxPooling2D(2),
        keras.layers.ReLU(),
        keras.layers.Flatten(),
        keras.layers.Dense(50, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10),
        keras.layers.Activation(tf.nn.log_softmax),
    ])


model = Net()

# Bluefog: scale learning rate by the number of GPUs.
optimizer = keras.optimizers.Adam(learning_rate=args.lr * bf.size())

# Bluefog: broadcast parameters & optimizer state.
optimizer.build(model.trainable_variables)
bf.broadcast_variables(model.weights + optimizer.variables, root_rank=0)

# Bluefog: wrap optimizer with DistributedOptimizer.
base_dist_optimizer = (
    bf.DistributedAdaptThenCombineOptimizer if args.atc_style else
    bf.DistributedAdaptWithCombineOptimizer)
if args.dist_optimizer == 'win_put':
    optimizer = bf.DistributedWinPutOptimizer(optimizer, model=model)
elif args.dist_optimizer == 'allreduce':
    optimizer = base_dist_optimizer(
        optimizer, model=model, communication_type=bf.CommunicationType.allreduce)
elif args.dist_optimizer == 'neighbor_allreduce':
    optimizer = base_dist_optimizer(
        optimizer, model=model, communication_type=bf.CommunicationType.neighbor_allreduce)
elif args.dist_optimizer == 'hierarchical_neighbor_allreduce':
    optimizer = base_dist_optimizer(
        optimizer, model=model,
        communication_type=bf.CommunicationType.hierarchical_neighbor_allreduce)
elif args.dist_optimizer == 'gradient_allreduce':
    optimizer = bf.DistributedGradientAllreduceOptimizer(
        optimizer, model=model)
else:
    raise ValueError('Unknown args.dist-optimizer type -- ' + args.dist_optimizer + '\n' +
                     'Please set the argument to be one of ' +
                     '[neighbor_allreduce, gradient_allreduce, allreduce, ' +
                     'hierarchical_neighbor_allreduce, win_put]')

if not args.disable_dynamic_topology:
    if args.dist_optimizer == 'neighbor_allreduce':
        if bf.is_homogeneous() and bf.size() > bf.local_size():
            dynamic_neighbor_allreduce_gen = topology_util.GetInnerOuterExpo2DynamicSendRecvRanks(
                bf.size(),
                local_size=bf.local_size(),
                self_rank=bf.rank())
        else:
            dynamic_neighbor_allreduce_gen = topology_util.GetDynamicOnePeerSendRecvRanks(
                bf.load_topology(), bf.rank())
    elif args.dist_optimizer == 'hierarchical_neighbor_allreduce':
        # This optimizer can use following dynamic topo only so far.
        dynamic_machine_neighbor_allreduce_gen = topology_util.GetExp2DynamicSendRecvMachineRanks(
            world_size=bf.size(),
            local_size=bf.local_size(),
            self_rank=bf.rank(),
            local_rank=bf.local_rank()
        )
    else:
        dynamic_neighbor_allreduce_gen = topology_util.GetDynamicOnePeerSendRecvRanks(
            bf.load_topology(), bf.rank())


def dynamic_topology_update(epoch, batch_idx):
    if args.dist_optimizer == 'win_put':
        if epoch < 3:
            return
        num_out_neighbors = len(bf.out_neighbor_ranks())
        sent_neighbor = bf.out_neighbor_ranks()[batch_idx % num_out_neighbors]
        optimizer.dst_weights = {sent_neighbor: 1.0}
    elif args.dist_optimizer == 'neighbor_allreduce':
        send_neighbors, recv_neighbors = next(dynamic_neighbor_allreduce_gen)
        optimizer.dst_weights = send_neighbors
        optimizer.src_weights = {r: 1/(len(recv_neighbors) + 1) for r in recv_neighbors}
        optimizer.self_weight = 1 / (len(recv_neighbors) + 1)
        optimizer.enable_topo_check = False
    elif args.dist_optimizer == 'hierarchical_neighbor_allreduce':
        send_machines, recv_machines = next(dynamic_machine_neighbor_allreduce_gen)
        optimizer.dst_machine_weights = send_machines
        optimizer.src_machine_weights = {r: 1/(len(recv_machines) + 1) for r in recv_machines}
        optimizer.self_weight = 1 / (len(recv_machines) + 1)
        optimizer.enable_topo_check = False
    else:
        pass


def nll_loss(output, target):
    return -tf.reduce_mean(tf.gather(output, target, axis=1, batch_dims=1))


def train(epoch):
    for batch_idx, (data, target) in enumerate(train_loader(epoch)):
        if not args.disable_dynamic_topology:
            dynamic_topology_update(epoch, batch_idx)

        if args.dist_optimizer == 'neighbor_allreduce' and (batch_idx % 100 == 99):
            optimizer.communication_type = bf.CommunicationType.allreduce

        with tf.GradientTape() as tape:
            output = model(data, training=True)
            loss = nll_loss(output, target)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if batch_idx % args.log_interval == 0 and bf.rank() == 0:
            done = 100.0 * batch_idx * args.batch_size / len(train_x)
            print(f"[{bf.rank()}] Train Epoch: {epoch} [{batch_idx * len(data)}/"
                  f"{len(train_x)} ({done:.0f}%)]\tLoss: {float(loss):.6f}", flush=True)

        if args.dist_optimizer == 'neighbor_allreduce' and (batch_idx % 100 == 99):
            optimizer.communication_type = bf.CommunicationType.neighbor_allreduce


def metric_average(val, name):
    tensor = tf.constant(val, tf.float64)
    avg_tensor = bf.allreduce(tensor, name=name)
    return float(avg_tensor)


def test(record):
    test_loss = 0.0
    test_accuracy = 0.0
    for start in range(0, len(test_x), args.test_batch_size):
        data = test_x[start:start + args.test_batch_size]
        target = test_y[start:start + args.test_batch_size]
        output = model(data, training=False)
        # sum up batch loss
        test_loss += float(nll_loss(output, target)) * len(target)
        # get the index of the max log-probability
        pred = np.argmax(output, axis=1)
        test_accuracy += float(np.sum(pred == target))

    # Bluefog: use the size of this worker's partition.
    test_loss /= len(test_x)
    test_accuracy /= len(test_x)

    # Bluefog: average metric values across workers.
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")

    # Bluefog: print output only on first rank.
    if bf.rank() == 0:
        print(f"\nTest set: Average loss: {test_loss:.4f}, "
              f"Accuracy: {100.0 * test_accuracy:.2f}%\n", flush=True)
    record.append((test_loss, 100.0 * test_accuracy))


test_record = []
for epoch in range(1, args.epochs + 1):
    train(epoch)
    test(test_record)
print(f"[{bf.rank()}]: ", test_record)
bf.barrier()
