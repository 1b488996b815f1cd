"""bluefog on Ray: run a training function on Ray actors that form one bluefog job.

``RayExecutor`` starts one actor per worker on a Ray cluster, gives them a Gloo rendezvous
(rank 0's node address, a free port, a per-job token) and runs functions on all of them; each
function calls ``bf.init()`` and trains as under any launcher. The names and arguments are
Horovod's (``horovod.ray.RayExecutor``). Ray is an optional dependency:
``pip install ray``. ``ElasticRayExecutor`` (and
``RayExecutor(min_workers=...)``) runs elastic jobs whose workers survive a lost actor.
"""

from bluefog.ray.elastic import ElasticRayExecutor, ElasticRaySettings
from bluefog.ray.executor import RayExecutor, RaySettings, WorkerFailedError

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayExecutor", "RaySettings",
           "WorkerFailedError"]
