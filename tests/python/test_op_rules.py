"""The Python table of accepted dtypes (op_rules.OP_RULES) agrees with the C++ side.

Two checks, single process, no init():
* against the TensorFlow op registrations (the ``T`` attribute of every Bluefog op);
* against the C++ core's own rule, ``bluefog_op_accepts_dtype`` in the C API, for every op type
  and dtype of the core's enums.
"""

import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from bluefog.common import basics
from bluefog.tensorflow import op_library, op_rules

# The core's enums (csrc/core/types.h), by value.
CORE_DTYPES = list(op_rules.CORE_DTYPES)
# OpType value -> the Python ops that submit requests of that type.
CORE_OP_TYPES = {
    0: ["allreduce", "grouped_allreduce"],
    1: ["allgather"],
    2: ["broadcast"],
    3: ["neighbor_allreduce", "hierarchical_neighbor_allreduce"],
    4: ["neighbor_allgather"],
    5: ["neighbor_allgather.grad"],
    6: ["alltoall"],
    7: ["reducescatter", "grouped_reducescatter"],
    11: ["win_create", "win_put", "win_accumulate", "win_update"],
}


def test_error_prefix_format():
    # Single process, no init(): the rank is unknown.
    assert (op_rules.op_error_prefix("allreduce", "w.0")
            == "rank ?: bluefog allreduce of tensor 'w.0'")
    assert (op_rules.op_error_prefix("grouped_allreduce", "g", of_tensor=False)
            == "rank ?: bluefog grouped_allreduce 'g'")
    assert op_rules.op_error_prefix("broadcast_variables") == "rank ?: bluefog broadcast_variables"


def test_every_python_op_maps_to_a_core_op_type():
    mapped = sorted(op for ops in CORE_OP_TYPES.values() for op in ops)
    assert mapped == sorted(op_rules.OP_RULES)


def test_every_python_dtype_is_a_core_dtype():
    assert op_rules.ALL_DTYPES == frozenset(CORE_DTYPES)


@pytest.mark.parametrize("op", sorted(op_rules.OP_RULES))
def test_table_matches_tensorflow_registration(op):
    rule = op_rules.OP_RULES[op]
    assert op_library.ops is not None  # the registrations come with the loaded library
    op_def = op_def_registry.get(rule.tf_op_type)
    assert op_def is not None, f"{rule.tf_op_type} is not registered"
    (attr,) = [a for a in op_def.attr if a.name == "T"]
    registered = frozenset(tf.as_dtype(t) for t in attr.allowed_values.list.type)
    assert registered == rule.dtypes


@pytest.mark.parametrize("op_type", sorted(CORE_OP_TYPES))
def test_table_matches_core(op_type):
    for dtype_value, dtype in enumerate(CORE_DTYPES):
        core = basics.op_accepts_dtype(op_type, dtype_value)
        for op in CORE_OP_TYPES[op_type]:
            python = dtype in op_rules.accepted_dtypes(op)
            assert python == core, (f"{op} with {dtype.name}: Python "
                                    f"{'accepts' if python else 'rejects'}, the core "
                                    f"{'accepts' if core else 'rejects'}")
