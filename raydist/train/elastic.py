"""Elastic runs: a Ray Train controller callback that makes a restart after a lost node count the nodes that
are left, not those of a few seconds before."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback

logger = logging.getLogger(__name__)

RECOUNT_TIMEOUT_S = 5.0  # the coordinator's answer
PROBE_TIMEOUT_S = 1.0  # a node's raylet port
DEAD_NODE_WAIT_S = (
    60.0  # for the GCS to declare unreachable nodes dead (Ray's default: ~15 s of missed checks)
)


class FreshCapacityOnRestart(ControllerCallback):
    """Before the controller restarts a failed worker group, have Ray's autoscaling coordinator recount the
    cluster's nodes, once the GCS knows which are gone.

    An elastic run picks its worker count from the resources the coordinator (a Ray Data actor) has reserved
    for it, which it recomputes from ``ray.nodes()`` only every 20 s. Right after a node dies, that count
    still includes it (and so may ``ray.nodes()``: the surviving workers often fail on the broken connection
    before the GCS has missed enough health checks): the restart asks for as many workers as before, its
    placement group can never be placed, and the run waits the whole worker-group start timeout before it
    tries again with fewer. This callback first waits (at most :data:`DEAD_NODE_WAIT_S`) until every node the
    GCS lists as alive answers on its raylet port or is declared dead, then asks for one recount
    (``get_reserved_resources(recompute=True)``, a private Ray 2.60 API). If anything fails, the run still
    continues after the start timeout."""

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        if getattr(failure_decision, "name", "") != "RETRY":
            return
        try:
            wait_for_dead_nodes(DEAD_NODE_WAIT_S)
            from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
                get_or_create_autoscaling_coordinator,
            )

            coordinator = get_or_create_autoscaling_coordinator()
            ray.get(
                coordinator.get_reserved_resources.remote("raydist-recount", recompute=True),
                timeout=RECOUNT_TIMEOUT_S,
            )
        except Exception:  # an optimisation: the start timeout still bounds the wait
            logger.warning("could not recount the cluster's nodes before a restart", exc_info=True)


def unreachable_alive_nodes() -> list[str]:
    """IDs of the nodes the GCS lists as alive whose raylet does not accept a connection."""
    gone = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        try:
            socket.create_connection(
                (node["NodeManagerAddress"], node["NodeManagerPort"]), PROBE_TIMEOUT_S
            ).close()
        except OSError:
            gone.append(node["NodeID"])
    return gone


def wait_for_dead_nodes(limit_s: float) -> None:
    """Until the GCS has declared dead every node whose raylet no longer answers (at most ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    while unreachable_alive_nodes() and time.monotonic() < deadline:
        time.sleep(0.5)
