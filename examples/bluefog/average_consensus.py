"""Bluefog's average-consensus example (examples/pytorch_average_consensus.py) on TensorFlow.

    bfrun -np 4 python examples/bluefog/average_consensus.py
    bfrun -np 4 python examples/bluefog/average_consensus.py --enable-dynamic-topology
    bfrun -np 4 python examples/bluefog/average_consensus.py --asynchronous-mode  # push-sum

Every rank starts from its own random vector; repeated neighbour averaging
(``bf.neighbor_allreduce``) over the virtual topology, or push-sum over one-sided windows
(``bf.win_accumulate`` + ``bf.win_update_then_collect``), drives every rank to the mean of the
starting vectors. Each rank prints the relative distance to that mean after the last iteration
(``MSE at last iteration``): about 1e-15 for the default 200 iterations on 4 ranks.

The port keeps Bluefog's script and changes only the framework calls: torch tensors became
``tf.Tensor`` / ``tf.Variable`` (the push-sum window is made from a ``tf.Variable``, which the
window ops update in place as torch's do), ``torch.norm`` became ``tf.norm``, and the CUDA and
NCCL branches are gone.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import topology_util  # noqa: E402

parser = argparse.ArgumentParser(description='TensorFlow Average Consensus',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--data-size', type=int, default=100000,
                    help='the size of data.')
parser.add_argument('--max-iters', type=int, default=200,
                    help='maximum iterations')
parser.add_argument('--virtual-topology', type=str, default="expo2",
                    help='The underlying virtual topology. Supporting options are ' +
                    '[expo2(Default), ring, mesh, star, InnerOuterExpo2].')
parser.add_argument('--asynchronous-mode', action='store_true', default=False,
                    help='Use one-sided ops to run asynchronous push sum algorithm')
parser.add_argument('--enable-dynamic-topology', action='store_true',
                    default=False, help=('Enable each iteration to transmit one neighbor ' +
                                         'per iteration dynamically.'))
parser.add_argument(
    "--plot-interactive", action='store_true', help="Use plt.show() to present the plot."
)
parser.add_argument(
    "--save-plot-file", default='average_consensus_plot.png', help="Saving the plot in the file."
)
parser.add_argument('--seed', type=int, default=2020,
                    help='Seed for randomness.')

args = parser.parse_args()

bf.init()

tf.random.set_seed(args.seed * bf.rank())
x = tf.random.normal([args.data_size], dtype=tf.float64)

if args.virtual_topology == "expo2":
    pass
elif args.virtual_topology == "expo3":
    bf.set_topology(topology_util.ExponentialGraph(bf.size(), base=3))
elif args.virtual_topology == "expo4":
    bf.set_topology(topology_util.ExponentialGraph(bf.size(), base=4))
elif args.virtual_topology == "ring":
    bf.set_topology(topology_util.RingGraph(bf.size(), connect_style=1))
elif args.virtual_topology == "mesh":
    bf.set_topology(topology_util.RingGraph(
        bf.size(), connect_style=0), is_weighted=True)
elif args.virtual_topology == "star":
    bf.set_topology(topology_util.StarGraph(bf.size()), is_weighted=True)
elif args.virtual_topology == "full":
    bf.set_topology(topology_util.FullyConnectedGraph(bf.size()))
else:
    raise ValueError("Unknown args.virtual_topology, supporting options are " +
                     "[expo2(Default), ring, mesh, star].")

x_bar = bf.allreduce(x, average=True)
mse = [tf.norm(x-x_bar, ord=2) / tf.norm(x_bar, ord=2)]

if not args.asynchronous_mode:
    self_weight = None
    neighbor_weights = None
    send_neighbors = None

    if args.enable_dynamic_topology:
        if args.virtual_topology == "InnerOuterExpo2":
            dynamic_neighbor_allreduce_gen = topology_util.GetInnerOuterExpo2DynamicSendRecvRanks(
                bf.size(), local_size=bf.local_size(), self_rank=bf.rank())
        else:
            dynamic_neighbor_allreduce_gen = topology_util.GetDynamicOnePeerSendRecvRanks(
                bf.load_topology(), bf.rank())

    for _ite in range(args.max_iters):
        if args.enable_dynamic_topology:
            send_neighbors, recv_neighbors = next(dynamic_neighbor_allreduce_gen)
            neighbor_weights = {
                r: 1/(len(recv_neighbors) + 1) for r in recv_neighbors}
            self_weight = 1 / (len(recv_neighbors) + 1)

        x = bf.neighbor_allreduce(x, name='x', self_weight=self_weight,
                                  src_weights=neighbor_weights,
                                  dst_weights=send_neighbors, enable_topo_check=False)
        mse.append(tf.norm(x-x_bar, ord=2) / tf.norm(x_bar, ord=2))
else:
    outdegree = len(bf.out_neighbor_ranks())
    indegree = len(bf.in_neighbor_ranks())

    # A tf.Variable: the window ops update it in place, as torch's update the tensor.
    x = tf.Variable(x)
    bf.turn_on_win_ops_with_associated_p()
    bf.win_create(x, name="x", zero_init=True)
    for i in range(args.max_iters):
        if args.enable_dynamic_topology:
            num_out_neighbors = len(bf.out_neighbor_ranks())
            sent_neighbor = bf.out_neighbor_ranks()[i % num_out_neighbors]
            dst_weights = {sent_neighbor: 0.5}
            self_weight = 0.5
        else:
            dst_weights = {rank: 1.0 / (outdegree + 1)
                           for rank in bf.out_neighbor_ranks()}
            self_weight = 1/(1+outdegree)

        bf.win_accumulate(x, name="x", self_weight=self_weight,
                          dst_weights=dst_weights, require_mutex=True)
        bf.win_update_then_collect(name="x")
        associated_p = bf.win_associated_p(name="x")
        mse.append(tf.norm(x/associated_p-x_bar, ord=2) /
                   tf.norm(x_bar, ord=2))

    # Do not forget to sync at last!
    bf.barrier()
    bf.win_update_then_collect(name="x")
    associated_p = bf.win_associated_p(name="x")
    print(f"associated p at {bf.rank()} is {associated_p}")
    bf.turn_off_win_ops_with_associated_p()
    mse.append(tf.norm(x/associated_p - x_bar, ord=2) /
               tf.norm(x_bar, ord=2))
    bf.win_free(name="x")

    p_push_sum = bf.allreduce(tf.constant([associated_p], tf.float64), average=True)
    if bf.rank() == 0:
        print("Average of p should be the 1 always. Actuall value is ", p_push_sum.numpy())


print("MSE at last iteration: ", float(mse[-1]))
if args.plot_interactive and bf.rank() == 0:
    import matplotlib.pyplot as plt
    plt.semilogy(mse)
    plt.savefig(args.save_plot_file)
    plt.show()
    plt.close()
