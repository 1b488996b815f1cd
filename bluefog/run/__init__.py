"""Launchers: ``bfrun`` (bfrun.py; gloo_launch.py without mpirun) and ``bluefog.run(fn, ...)``.

The package itself is callable: ``bluefog.run(fn, np=2)`` is ``bluefog.run.runner.run`` (Horovod's
``horovod.run``), while ``bluefog.run.bfrun`` and the other modules stay importable.
"""

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, fn, *args, **kwargs):
        from bluefog.run.runner import run

        return run(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
