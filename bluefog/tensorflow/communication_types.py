"""The combinations a decentralized optimizer may use (``communication_type``): this module's
strings and Bluefog's ``CommunicationType`` enum, and Bluefog's positional order of the
optimizers' arguments."""

from __future__ import annotations

import enum

COMMUNICATION_TYPES = ("neighbor_allreduce", "hierarchical_neighbor_allreduce", "allreduce",
                       "empty")


class CommunicationType(enum.Enum):
    """Bluefog's names for the combinations of the decentralized optimizers; a member (or its
    value string) may be passed as ``communication_type`` wherever a string of
    ``COMMUNICATION_TYPES`` is accepted."""

    neighbor_allreduce = "neighbor.allreduce"
    hierarchical_neighbor_allreduce = "hierarchical.neighbor.allreduce"
    allreduce = "allreduce"
    empty = "empty"


_BY_VALUE = {member.value: member.name for member in CommunicationType}

class _Default:
    """The default ``communication_type`` ("neighbor_allreduce"), told apart from a given one."""

    def __repr__(self) -> str:
        return "'neighbor_allreduce'"


DEFAULT = _Default()


def normalize(value):
    """``value`` as one of COMMUNICATION_TYPES when it names one (a CommunicationType member or
    its value string), else unchanged (for ``wrap``'s check)."""
    if isinstance(value, CommunicationType):
        return value.name
    if isinstance(value, str) and value in _BY_VALUE:
        return _BY_VALUE[value]
    return value


def split_model(model, communication_type, default):
    """Bluefog's ``(optimizer, model, communication_type)`` positional order and this module's
    ``(optimizer, communication_type)`` both: returns the communication type. ``model`` is
    accepted for Bluefog's signature only (the variables combined are those ``apply`` gets)."""
    if model is not None and (isinstance(model, (str, CommunicationType))):
        if communication_type is not DEFAULT:
            raise ValueError("bluefog: communication_type given twice (positionally and by "
                             "keyword)")
        return model
    return default if communication_type is DEFAULT else communication_type
