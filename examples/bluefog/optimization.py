"""Bluefog's decentralized optimization example (examples/pytorch_optimization.py) on TensorFlow.

    bfrun -np 4 python examples/bluefog/optimization.py --method exact_diffusion
    bfrun -np 4 python examples/bluefog/optimization.py --method gradient_tracking
    bfrun -np 4 python examples/bluefog/optimization.py --method push_diging
    bfrun -np 4 python examples/bluefog/optimization.py --method diffusion \
        --task linear_regression --topology expo2

Every rank holds its own 20 samples of a logistic (or linear) regression problem; together
they minimise the sum of the ranks' losses. Distributed gradient descent (allreduce of the
gradients) finds the solution first; then the chosen decentralized method finds it again with
neighbour communication only: exact diffusion and diffusion (``bf.neighbor_allreduce`` with
the topology's weights), gradient tracking (``bf.neighbor_allreduce_nonblocking``, overlapped
with the gradient computation) or push-DIGing (``bf.win_accumulate`` on a window, for directed
graphs). Each rank prints the norm of the global gradient at its result, which is 0 at the
solution (to ~1e-10 after 1000 iterations for exact diffusion, gradient tracking and
push-DIGing), and the norm of its local gradient, which is not: each rank reaches the global
solution, not its own. Plain diffusion stops at a small distance from it (about the step size
times the gradients' disagreement).

The port keeps Bluefog's script and changes only the framework calls: torch autograd became
``tf.GradientTape`` (``loss_step`` returns the gradient instead of filling ``.grad``;
``norm2`` keeps torch's zero gradient of the norm at 0), in-place
tensor updates of the push-DIGing window became ``tf.Variable.assign``, and the plot is drawn
only when matplotlib is installed.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import topology_util  # noqa: E402

# Parser
parser = argparse.ArgumentParser(
    description="TensorFlow decentralized optimization example",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
)
parser.add_argument(
    "--save-plot-file", default='', help="Saving the plot in the file (needs matplotlib)."
)
parser.add_argument(
    "--plot-interactive", action='store_true', help="Use plt.show() to present the plot."
)
parser.add_argument(
    "--max-iter", action='store', type=int, default=1000, help="maximum iteration number."
)
parser.add_argument(
    "--lr", action='store', type=float, default=1e-1, help="learning rate"
)
parser.add_argument(
    "--method", help="this example supports exact_diffusion, gradient_tracking, and push_diging",
    default='exact_diffusion'
)
parser.add_argument(
    "--task", help="this example supports linear_regression and logistic_regression",
    default='logistic_regression'
)
parser.add_argument(
    "--topology", help="this example supports mesh, star, ring, and expo2",
    default='ring'
)
args = parser.parse_args()


def finalize_plot():
    import matplotlib.pyplot as plt
    plt.savefig(args.save_plot_file)
    if args.plot_interactive:
        plt.show()
    plt.close()


def generate_data(m, n, task='logistic_regression'):

    if task == 'logistic_regression':
        X = tf.random.normal([m, n], dtype=tf.float64)
        w_0 = tf.random.normal([n, 1], dtype=tf.float64)
        y = tf.random.uniform([m, 1], dtype=tf.float64) < 1 / (1+tf.exp(X @ w_0))
        y = tf.cast(y, tf.float64)
        y = 2*y - 1
    elif task == 'linear_regression':
        X = tf.random.normal([m, n], dtype=tf.float64)
        x_o = tf.random.normal([n, 1], dtype=tf.float64)
        ns = 0.1*tf.random.normal([m, 1], dtype=tf.float64)
        y = X @ x_o + ns
    else:
        raise NotImplementedError(
            'Task not supported. This example only supports' +
            ' linear_regression and logistic_regression')

    return X, y


@tf.custom_gradient
def norm2(v):
    """torch.norm(v, p=2), whose gradient at 0 is 0 as torch's (tf.norm's is NaN there)."""
    value = tf.norm(v, ord=2)

    def grad(upstream):
        return upstream * tf.math.divide_no_nan(v, value)

    return value, grad


def _loss_step(X, y, x_, loss='logistic_regression', **kwargs):
    """Calculate the loss and its gradient via tf.GradientTape."""

    with tf.GradientTape() as tape:
        tape.watch(x_)
        if loss == 'logistic_regression':
            rho = kwargs.get('rho', 1e-1)
            loss_ = tf.reduce_mean(tf.math.log(1 + tf.exp(-y*(X @ x_)))) + \
                0.5*rho*norm2(x_)
        elif loss == 'linear_regression':
            loss_ = 0.5*tf.reduce_mean(norm2(X @ x_ - y))

        else:
            raise NotImplementedError(
                'Task not supported. This example only supports' +
                ' linear_regression and logistic_regression'
            )

    return loss_, tape.gradient(loss_, x_)


def loss_step(X, y, x_, tensor_name, loss='logistic_regression', **kwargs):
    """Calculate the loss and its gradient via tf.GradientTape."""

    if os.getenv('BLUEFOG_TIMELINE'):
        with bf.timeline_context(tensor_name=tensor_name,
                                 activity_name="gradient computation"):
            return _loss_step(X, y, x_, loss=loss, **kwargs)

    else:
        return _loss_step(X, y, x_, loss=loss, **kwargs)

# ================== Distributed gradient descent ================================
# Calculate the solution with distributed gradient descent:
# x^{k+1} = x^k - alpha * allreduce(local_grad)
# it will be used to verify the solution of various decentralized algorithms.
# ================================================================================


def distributed_grad_descent(X, y, loss, maxite=5000, alpha=1e-1, **kwargs):

    if loss == 'logistic_regression':
        rho = kwargs.get('rho', 1e-1)
    elif loss == 'linear_regression':
        rho = 0
    else:
        raise NotImplementedError(
            'Task not supported. This example only supports' +
            ' linear_regression and logistic_regression')

    w_opt = tf.zeros([n, 1], dtype=tf.float64)

    for _ in range(maxite):
        # calculate gradient via tf.GradientTape
        _, local_grad = loss_step(X, y, w_opt, tensor_name='allreduce.gradient',
                                  loss=loss, rho=rho)
        # global gradient
        grad = bf.allreduce(local_grad, name='gradient')

        # distributed gradient descent
        w_opt = w_opt - alpha*grad

    _, local_grad = loss_step(X, y, w_opt, tensor_name='allreduce.gradient',
                              loss=loss, rho=rho)
    grad = bf.allreduce(local_grad, name='gradient')  # global gradient

    # evaluate the convergence of distributed logistic regression
    # the norm of global gradient is expected to 0 (optimality condition)
    global_grad_norm = tf.norm(grad, ord=2)
    print(f"[DG] Rank {bf.rank()}: global gradient norm: {float(global_grad_norm)}")

    # the norm of local gradient is expected not be be close to 0
    # this is because each rank converges to global solution, not local solution
    local_grad_norm = tf.norm(local_grad, ord=2)
    print(f"[DG] Rank {bf.rank()}: local gradient norm: {float(local_grad_norm)}")

    return w_opt

# ==================== Diffusion ================================================
# Calculate the solution with diffusion:
# x^{k+1} = allreduce(x^k - alpha * local_grad)
#
# Reference:
#
# [R1] A. H. Sayed, ``Adaptive networks'', Proceedings of the IEEE, 2014
#
# [R2] A. H. Sayed, ``Adaptation, learning, and optimization over networks'', 2014
# ================================================================================


def diffusion(X, y, w_opt, loss, maxite=2000, alpha=1e-1, **kwargs):

    if loss == 'logistic_regression':
        rho = kwargs.get('rho', 1e-1)
    elif loss == 'linear_regression':
        rho = 0
    else:
        raise NotImplementedError(
            'Task not supported. This example only supports' +
            ' linear_regression and logistic_regression')

    topology = bf.load_topology()
    self_weight, neighbor_weights = topology_util.GetRecvWeights(
        topology, bf.rank())

    w = tf.zeros([n, 1], dtype=tf.float64)
    mse = []

    for _i in range(maxite):
        # calculate loccal gradient via tf.GradientTape
        _, grad = loss_step(X, y, w,
                            tensor_name='neighbor.allreduce.local_variable', loss=loss, rho=rho)

        # diffusion
        phi = w - alpha * grad
        w = bf.neighbor_allreduce(phi,
                                  self_weight=self_weight,
                                  src_weights=neighbor_weights,
                                  name='local variable')

        # record convergence
        if bf.rank() == 0:
            mse.append(tf.norm(w - w_opt, ord=2))

    return w, mse

# ==================== Exact Diffusion ===========================================
# Calculate the true solution with exact diffusion recursion as follows:
#
# psi^{k+1} = w^k - alpha * grad(w^k)
# phi^{k+1} = psi^{k+1} + w^k - psi^{k}
# w^{k+1} = neighbor_allreduce(phi^{k+1})
#
# Reference:
#
# [R1] K. Yuan, B. Ying, X. Zhao, and A. H. Sayed, ``Exact diffusion for distributed
# optimization and learning -- Part I: Algorithm development'', 2018. (Alg. 1)
# link: https://arxiv.org/abs/1702.05122
#
# [R2] Z. Li, W. Shi and M. Yan, ``A Decentralized Proximal-gradient Method with
#  Network Independent Step-sizes and Separated Convergence Rates'', 2019
# ================================================================================


def exact_diffusion(X, y, w_opt, loss, maxite=2000, alpha=1e-1, use_Abar=True, **kwargs):

    if loss == 'logistic_regression':
        rho = kwargs.get('rho', 1e-1)
    elif loss == 'linear_regression':
        rho = 0
    else:
        raise NotImplementedError(
            'Task not supported. This example only supports' +
            ' linear_regression and logistic_regression'
        )

    topology = bf.load_topology()
    self_weight, neighbor_weights = topology_util.GetRecvWeights(
        topology, bf.rank())

    if bf.rank() == 0:
        print(f'self weights with A: {self_weight}\n')
        print('neighbor weights with A:\n')
        for k, v in neighbor_weights.items():
            print(k, v)

    w = tf.zeros([n, 1], dtype=tf.float64)
    psi_prev = tf.identity(w)
    mse = []

    # construct A_bar
    if use_Abar:
        self_weight = (self_weight+1)/2
        for k, v in neighbor_weights.items():
            neighbor_weights[k] = v/2

    for _i in range(maxite):
        # calculate loccal gradient via tf.GradientTape
        _, grad = loss_step(X, y, w, tensor_name='neighbor.allreduce.local_variable',
                            loss=loss, rho=rho)

        # exact diffusion
        psi = w - alpha * grad
        phi = psi + w - psi_prev
        w = bf.neighbor_allreduce(phi,
                                  self_weight=self_weight,
                                  src_weights=neighbor_weights,
                                  name='local variable')
        psi_prev = tf.identity(psi)

        # record convergence
        if bf.rank() == 0:
            mse.append(tf.norm(w - w_opt, ord=2))

    return w, mse

# ======================= gradient tracking =====================================
# Calculate the true solution with gradient tracking (GT for short):
#
# w^{k+1} = neighbor_allreduce(w^k) - alpha*q^k
# q^{k+1} = neighbor_allreduce(q^k) + grad(w^{k+1}) - grad(w^k)
# where q^0 = grad(w^0)
#
# Reference:
# [R1] A. Nedic, A. Olshevsky, and W. Shi, ``Achieving geometric convergence
# for distributed optimization over time-varying graphs'', 2017. (Alg. 1)
#
# [R2] G. Qu and N. Li, ``Harnessing smoothness to accelerate distributed
# optimization'', 2018
#
# [R3] J. Xu et.al., ``Augmented distributed gradient methods for multi-agent
# optimization under uncoordinated constant stepsizes'', 2015
#
# [R4] P. Di Lorenzo and G. Scutari, ``Next: In-network nonconvex optimization'',
# 2016
# ================================================================================


def gradient_tracking(X, y, w_opt, loss, maxite=2000, alpha=1e-1, **kwargs):

    if loss == 'logistic_regression':
        rho = kwargs.get('rho', 1e-1)
    elif loss == 'linear_regression':
        rho = 0
    else:
        raise NotImplementedError(
            'Task not supported. This example only supports' +
            ' linear_regression and logistic_regression')

    w = tf.zeros([n, 1], dtype=tf.float64)
    _, q = loss_step(X, y, w, tensor_name='neighbor.allreduce.Grad.Tracking.w',
                     loss=loss, rho=rho)  # q^0 = grad(w^0)

    grad_prev = tf.identity(q)
    mse = []
    for _ in range(maxite):

        # Algorithm:
        # w^{k+1} = neighbor_allreduce(w^k) - alpha*q^k
        # q^{k+1} = neighbor_allreduce(q^k) + grad(w^{k+1}) - grad(w^k)

        # Notice the communication of neighbor_allreduce can overlap with gradient computation.
        w_handle = bf.neighbor_allreduce_nonblocking(w, name='Grad.Tracking.w')
        q_handle = bf.neighbor_allreduce_nonblocking(q, name='Grad.Tracking.q')
        w = bf.synchronize(w_handle) - alpha * q
        # calculate local gradient
        _, grad = loss_step(X, y, w, tensor_name='neighbor.allreduce.Grad.Tracking.w',
                            loss=loss, rho=rho)
        q = bf.synchronize(q_handle) + grad - grad_prev
        grad_prev = grad

        # record convergence
        if bf.rank() == 0:
            mse.append(tf.norm(w - w_opt, ord=2))

    return w, mse

# ======================= Push-DIGing for directed graph =======================
# Calculate the true solution with Push-DIGing:
#
# u^{k+1} = directed_neighbor_allreduce(u^k - alpha y^k)
# v^{k+1} = directed_neighbor_allreduce(v^k)
# x^{k+1} = (v^{k+1})^{-1}*u^{k+1}
# y^{k+1} = directed_neighbor_allreduce(y^k) + grad(x^{k+1}) - grad(x^k)
#
# Reference:
#
# [R1] A. Nedic, A. Olshevsky, and W. Shi, ``Achieving geometric convergence
# for distributed optimization over time-varying graphs'', 2017. (Alg. 2)
# ============================================================================


def push_diging(X, y, w_opt, loss, maxite=2000, alpha=1e-1, **kwargs):

    if loss == 'logistic_regression':
        rho = kwargs.get('rho', 1e-1)
    elif loss == 'linear_regression':
        rho = 0
    else:
        raise NotImplementedError(
            'Task not supported. This example only supports' +
            ' linear_regression and logistic_regression')

    outdegree = len(bf.out_neighbor_ranks())

    # We let w = col{u, y, v}, i.e., u, y, v = w[:n], w[n:2*n], w[2n]
    # Insteady of three directed_neighbor_allreduce operations for u, y,
    # and v respectively, we exploit one directed_neighbor_allreduce for
    # the combo vector w. This guarantees u, y, and v to be transmitted
    # simultanesly and avoids the mismatch between them. Experiments
    # show directed_neighbor_allreduce(w) is crutial for convergence of
    # push_diging.
    # A tf.Variable: the window ops update it in place, as torch's update the tensor.
    w = tf.Variable(tf.zeros([2*n+1, 1], dtype=tf.float64))
    x = tf.zeros([n, 1], dtype=tf.float64)
    _, grad = loss_step(X, y, x, tensor_name='w_buff', loss=loss, rho=rho)

    w[n:2*n].assign(grad)

    w[-1].assign([1.0])
    grad_prev = tf.identity(w[n:2*n])

    bf.win_create(w, name="w_buff", zero_init=True)

    mse = []
    for _ in range(maxite):
        bf.barrier()

        w[:n].assign(w[:n] - alpha*w[n:2*n])
        bf.win_accumulate(
            w, name="w_buff",
            dst_weights={rank: 1.0 / (outdegree*2)
                         for rank in bf.out_neighbor_ranks()},
            require_mutex=True)
        w.assign(w / 2)
        bf.barrier()

        bf.win_update_then_collect(name="w_buff")  # assigns w

        x = w[:n]/w[-1]
        _, grad = loss_step(X, y, x, tensor_name='w_buff', loss=loss, rho=rho)

        w[n:2*n].assign(w[n:2*n] + grad - grad_prev)
        grad_prev = grad
        if bf.rank() == 0:
            mse.append(tf.norm(x - w_opt, ord=2))

    bf.barrier()
    bf.win_update_then_collect(name="w_buff")  # assigns w
    x = w[:n]/w[-1]

    return x, mse


# ======================= Code starts here =======================
bf.init()
if args.topology == 'mesh':
    bf.set_topology(topology_util.MeshGrid2DGraph(bf.size()), is_weighted=True)
elif args.topology == 'expo2':
    bf.set_topology(topology_util.ExponentialGraph(bf.size()))
elif args.topology == 'star':
    bf.set_topology(topology_util.StarGraph(bf.size()), is_weighted=True)
elif args.topology == 'ring':
    bf.set_topology(topology_util.RingGraph(bf.size()))
else:
    raise NotImplementedError(
        'Topology not supported. This example only supports' +
        ' mesh, star, ring and expo2'
    )


# Generate data for logistic regression (synthesized data)
tf.random.set_seed(123417 * bf.rank())
m, n = 20, 5
rho = 1e-2
X, y = generate_data(m, n, task=args.task)

# calculate the global solution w_opt via distributed gradient descent
w_opt = distributed_grad_descent(X, y, loss=args.task,
                                 maxite=args.max_iter, alpha=args.lr, rho=rho)

# solve the logistic regression with indicated decentralized algorithms
if args.method == 'diffusion':
    w, mse = diffusion(X, y, w_opt, loss=args.task,
                       maxite=args.max_iter, alpha=args.lr, rho=rho)
elif args.method == 'exact_diffusion':
    w, mse = exact_diffusion(X, y, w_opt, loss=args.task,
                             maxite=args.max_iter, alpha=args.lr,
                             use_Abar=True, rho=rho)
elif args.method == 'gradient_tracking':
    w, mse = gradient_tracking(X, y, w_opt, loss=args.task,
                               maxite=args.max_iter, alpha=args.lr, rho=rho)
elif args.method == 'push_diging':
    w, mse = push_diging(X, y, w_opt, loss=args.task,
                         maxite=args.max_iter, alpha=args.lr, rho=rho)
else:
    raise NotImplementedError(
        'Algorithm not support. This example only supports' +
        ' exact_diffusion, gradient_tracking, and push_diging'
    )

# plot and print result
if bf.rank() == 0 and args.save_plot_file:
    import matplotlib.pyplot as plt
    plt.semilogy(mse)
    finalize_plot()

# calculate local and global gradient
_, local_grad = loss_step(X, y, w, tensor_name='w_buff', loss=args.task, rho=rho)
grad = bf.allreduce(local_grad, name='gradient')  # global gradient

# evaluate the convergence of gradient tracking for logistic regression
# the norm of global gradient is expected to be 0 (optimality condition)
global_grad_norm = tf.norm(grad, ord=2)
print(f"[{args.method}] Rank {bf.rank()}: global gradient norm: {float(global_grad_norm)}")

# the norm of local gradient is expected not to be close to 0
# this is because each rank converges to global solution, not local solution
local_grad_norm = tf.norm(local_grad, ord=2)
print(f"[{args.method}] Rank {bf.rank()}: local gradient norm: {float(local_grad_norm)}")
