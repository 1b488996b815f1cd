"""ibfrun's controller: ipyparallel's, with what bounds a stranger's connections to it
(``-m bluefog.run.ibfrun_controller``, started by ``ibfrun start``; arguments as
``ipyparallel.controller``'s).

* **CurveZMQ** (when this pyzmq has it): a connection completes ZeroMQ's handshake only if it
  knows the controller's CURVE key, which is written, like ipyparallel's HMAC key, only to the
  profile's private connection files and the engines' environment. Without it, any program that
  speaks ZeroMQ's protocol would stay connected for as long as it liked (ipyparallel would only
  drop its messages), and one that sends bytes not starting with ZeroMQ's greeting would be taken
  for an old ZeroMQ peer and kept too. With it, such connections end at the handshake. It also
  encrypts the cells and results between the client, controller and engines. Messages stay
  signed with the HMAC key as well.
* **A handshake deadline** of HANDSHAKE_S seconds (ZeroMQ's default is 30) on every TCP socket
  the controller binds, in its scheduler and heartbeat processes too: a connection that has not
  completed the handshake by then (idle, or dripping bytes) is closed.
* **TCP keepalive**, so that the connection of an engine whose host vanished is closed.
"""

from __future__ import annotations

import multiprocessing
import secrets
import sys
from typing import Optional, Sequence

import zmq

HANDSHAKE_S = 10
KEEPALIVE_IDLE_S = 60
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 6

_OPTIONS = ((zmq.HANDSHAKE_IVL, HANDSHAKE_S * 1000), (zmq.TCP_KEEPALIVE, 1),
            (zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S),
            (zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S),
            (zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_COUNT))


def _bind_bounded(bind):
    def bind_with_options(self, addr: str, *args, **kwargs):
        if str(addr).startswith("tcp://"):
            for option, value in _OPTIONS:
                self.setsockopt(option, value)
        return bind(self, addr, *args, **kwargs)

    bind_with_options.bluefog_bounded = True
    return bind_with_options


def bound_every_listener() -> None:
    """Every TCP socket this process (and the processes it forks) binds gets _OPTIONS."""
    if not getattr(zmq.Socket.bind, "bluefog_bounded", False):
        zmq.Socket.bind = _bind_bounded(zmq.Socket.bind)


def main(argv: Optional[Sequence[str]] = None) -> None:
    bound_every_listener()
    # ipyparallel runs its schedulers and heart monitor in multiprocessing children: forked,
    # they keep the patched bind (a spawned or forkserver child would import ipyparallel anew).
    multiprocessing.set_start_method("fork", force=True)
    from ipyparallel.controller.app import IPController
    from traitlets.config import Config

    config = Config()
    if zmq.has("curve"):
        config.IPController.enable_curve = True
        # ipyparallel drops message signing under CURVE unless a key is configured: keep both.
        config.Session.key = secrets.token_hex(32).encode()
    IPController.launch_instance(argv=list(sys.argv[1:] if argv is None else argv),
                                 config=config)


if __name__ == "__main__":
    main()
