"""Bluefog's per-step optimizer knobs: ``opt.self_weight``, ``opt.src_weights``,
``opt.dst_weights``, ``opt.src_machine_weights``, ``opt.dst_machine_weights``,
``opt.enable_topo_check`` and ``opt.force_barrier``.

Bluefog's examples assign them on the wrapped optimizer before a step to run a dynamic topology;
the next communication uses them. Here a knob is checked when it is assigned (its type and
ranks, and whether this optimizer's communication uses it: a knob that would be ignored is
refused), and the combination of the knobs is checked when a step uses it.

A step reads the knobs' current values: in eager mode directly, inside a traced step
(``tf.function``, ``model.fit``) through a ``tf.py_function`` that runs only while some weight
knob is set (a ``tf.Variable`` flag chooses between it and the topology's weights fixed at
tracing), so values assigned between calls of an already traced step are honoured.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from bluefog.common import basics, topology
from bluefog.tensorflow import op_rules

__all__ = ["KNOBS", "WEIGHT_KNOBS", "check", "Peers", "neighbor_peers", "machine_peers",
           "window_peers", "runtime_values"]

# The knobs with the value that changes nothing (Bluefog's defaults).
KNOBS: Dict[str, Any] = {"self_weight": None, "src_weights": None, "dst_weights": None,
                         "src_machine_weights": None, "dst_machine_weights": None,
                         "enable_topo_check": True, "force_barrier": False}
WEIGHT_KNOBS = ("self_weight", "src_weights", "dst_weights", "src_machine_weights",
                "dst_machine_weights")

# Which weight knobs each kind of communication reads.
USED_BY = {"neighbor_allreduce": ("self_weight", "src_weights", "dst_weights"),
           "hierarchical_neighbor_allreduce": ("self_weight", "src_machine_weights",
                                               "dst_machine_weights"),
           "allreduce": (), "empty": (),
           "winput": ("dst_weights",), "pushsum": ("self_weight", "dst_weights")}

# (send, recv, self_weight, recv_weights, send_weights): ranks (or machines) and weights.
Peers = Tuple[List[int], List[int], float, List[float], List[float]]


def _error(what: str, message: str) -> ValueError:
    return ValueError(f"rank {op_rules.rank_str()}: bluefog {what}: {message}")


def _number(what: str, knob: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise _error(what, f"opt.{knob} must be a number, got {value!r}")
    if not np.isfinite(float(value)):
        raise _error(what, f"opt.{knob} is {float(value)}; weights must be finite numbers")
    return float(value)


def _members(what: str, knob: str, keys, count: int, me: int, unit: str) -> List[int]:
    out = []
    for x in keys:
        if (isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer))
                or not 0 <= x < count or x == me):
            raise _error(what, f"opt.{knob} holds {x!r}, which is not another {unit} in "
                               f"[0, {count}) (this {unit} is {me})")
        out.append(int(x))
    if len(set(out)) != len(out):
        raise _error(what, f"opt.{knob} names a {unit} twice: {out}")
    return out


def _mapping(what: str, knob: str, value, lists: bool, count: int, me: int,
             unit: str) -> Dict[int, float]:
    """``value`` (a {rank: weight} dict, or with ``lists`` a list of ranks: weight 1.0) checked."""
    if isinstance(value, dict):
        keys = _members(what, knob, list(value), count, me, unit)
        return {k: _number(what, f"{knob}[{k}]", value[k]) for k in keys}
    if lists and isinstance(value, (list, tuple)):
        return {k: 1.0 for k in _members(what, knob, value, count, me, unit)}
    kinds = f"a dict {{{unit}: weight}}" + (f" or a list of {unit}s" if lists else "")
    raise _error(what, f"opt.{knob} must be {kinds}, got {type(value).__name__}")


def check(what: str, communication: str, schedule, knob: str, value) -> Any:
    """The value to store for ``opt.<knob> = value``; raises ValueError (naming the rank, the
    optimizer and the knob) when the value is malformed or this optimizer would ignore it."""
    if knob in ("enable_topo_check", "force_barrier"):
        if not isinstance(value, (bool, np.bool_)):
            raise _error(what, f"opt.{knob} must be a bool, got {value!r}")
        return bool(value)
    if value is None:
        return None
    used = USED_BY.get(communication, ())
    if knob not in used:
        if used:
            hint = f"this optimizer reads {', '.join('opt.' + k for k in used)}"
        else:
            hint = (f"communication_type {communication!r} takes no neighbour weights; use "
                    "'neighbor_allreduce' or 'hierarchical_neighbor_allreduce'")
        raise _error(what, f"opt.{knob} would be ignored by this optimizer ({hint}); set it "
                           "to None")
    if schedule is not None:
        raise _error(what, f"opt.{knob} and the schedule= iterator both choose the neighbours "
                           "of each step; wrap the optimizer without schedule= to set knobs")
    machines = knob.endswith("machine_weights")
    unit = "machine" if machines else "rank"
    if machines:
        count, me = topology.machine_size(), topology.machine_rank()
    else:
        count, me = basics.size(), basics.rank()
    if knob == "self_weight":
        return _number(what, knob, value)
    if knob == "src_weights" or knob == "src_machine_weights":
        return _mapping(what, knob, value, False, count, me, unit)
    mapping = _mapping(what, knob, value, True, count, me, unit)
    if knob == "dst_machine_weights" and any(w != 1.0 for w in mapping.values()):
        raise _error(what, "opt.dst_machine_weights other than 1.0 are not supported; give "
                           "the weights on the receiving side (opt.src_machine_weights) and "
                           "list the destination machines")
    if isinstance(value, (list, tuple)):
        return list(mapping)  # a list stays a list: unweighted sends
    return mapping


def _resolve(what: str, self_weight, src: Optional[Dict[int, float]], dst,
             src_knob: str, dst_knob: str, default: Callable[[], Tuple[float, Dict[int, float]]],
             in_ranks: List[int], out_ranks: List[int], unit: str) -> Peers:
    """Bluefog's combination rules: nothing set = the topology; ``self_weight`` alone = the
    topology's neighbours with that self weight; ``self_weight`` + ``src`` = the topology's
    neighbours with those weights (a neighbour missing from ``src`` counts 0); all three = this
    step's own neighbours (``dst`` lists the destinations; a dict scales what is sent)."""
    if src is None:
        if dst is not None:
            raise _error(what, f"opt.{dst_knob} is set without opt.{src_knob}; a dynamic "
                               f"topology needs opt.self_weight, opt.{src_knob} and "
                               f"opt.{dst_knob} (set opt.{dst_knob} = None for the topology)")
        default_self, recv = default()
        sw = default_self if self_weight is None else self_weight
        return (sorted(out_ranks), sorted(recv), sw, [recv[r] for r in sorted(recv)], [])
    if self_weight is None:
        raise _error(what, f"opt.{src_knob} is set without opt.self_weight; set both (and "
                           f"opt.{dst_knob} for a dynamic topology)")
    if dst is None:
        extra = sorted(set(src) - set(in_ranks))
        if extra:
            raise _error(what, f"opt.{src_knob} names {unit}s {extra} that are not in-neighbours "
                               f"in the topology (in-neighbours: {sorted(in_ranks)}); set "
                               f"opt.{dst_knob} too for a dynamic topology")
        recv = sorted(in_ranks)
        return (sorted(out_ranks), recv, self_weight, [src.get(r, 0.0) for r in recv], [])
    send = sorted(dst)
    send_weights = [dst[r] for r in send] if isinstance(dst, dict) else []
    recv = sorted(src)
    return (send, recv, self_weight, [src[r] for r in recv], send_weights)


def neighbor_peers(what: str, knobs: Dict[str, Any]) -> Peers:
    """This step's ``neighbor_allreduce`` ranks and weights from the knobs."""
    return _resolve(what, knobs["self_weight"], knobs["src_weights"], knobs["dst_weights"],
                    "src_weights", "dst_weights", topology.recv_weights,
                    topology.in_neighbor_ranks(), topology.out_neighbor_ranks(), "rank")


def machine_peers(what: str, knobs: Dict[str, Any]) -> Peers:
    """This step's ``hierarchical_neighbor_allreduce`` machines and weights from the knobs."""
    return _resolve(what, knobs["self_weight"], knobs["src_machine_weights"],
                    knobs["dst_machine_weights"], "src_machine_weights", "dst_machine_weights",
                    topology.machine_recv_weights, topology.in_neighbor_machine_ranks(),
                    topology.out_neighbor_machine_ranks(), "machine")


def window_peers(what: str, knobs: Dict[str, Any], out_ranks: List[int],
                 default_share: Optional[float]) -> Tuple[List[int], List[float], float]:
    """(ranks, weights, self_weight) of a window optimizer's put: ``opt.dst_weights`` (a subset
    of the window's out-neighbours) or all out-neighbours with ``default_share`` (1.0 for
    win_put); ``opt.self_weight`` or ``default_share``."""
    dst, sw = knobs["dst_weights"], knobs["self_weight"]
    share = 1.0 if default_share is None else default_share
    if dst is None:
        ranks, weights = sorted(out_ranks), [share] * len(out_ranks)
    else:
        extra = sorted(set(dst) - set(out_ranks))
        if extra:
            raise _error(what, f"opt.dst_weights names ranks {extra} that are not out-neighbours "
                               f"of this optimizer's window (out-neighbours: {sorted(out_ranks)}"
                               "; a window keeps the topology it was created with)")
        ranks = sorted(dst)
        weights = [dst[r] for r in ranks] if isinstance(dst, dict) else [1.0] * len(ranks)
    return ranks, weights, share if sw is None else sw


def runtime_values(resolve: Callable[[], tuple], dtypes: List[tf.DType],
                   shapes: List[list]) -> tuple:
    """``resolve()``'s values: as Python values in eager mode, as tensors fed by a py_function
    (run at every execution of the traced step, reading the knobs of that moment) in a graph."""
    if tf.executing_eagerly():
        return resolve()

    def fetch():
        return tuple(np.asarray(v, dtype=d.as_numpy_dtype) for v, d in zip(resolve(), dtypes))

    out = tf.py_function(fetch, [], dtypes)
    for t, shape in zip(out, shapes):
        t.set_shape(shape)
    return tuple(out)
