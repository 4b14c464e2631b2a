"""A local Ray cluster for the tests that kill a node mid-flight: a head with no CPUs and two
2-CPU worker nodes, all on the loopback (each test module gets its own: a killed node stays dead)."""

from __future__ import annotations

import os
from collections.abc import Iterator


def local_cluster() -> Iterator:
    # Ray resolves 127.0.0.1 to the machine's outward address unless told this is no real
    # cluster; everything here stays on the loopback (the loop's driver inherits this too)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                      "include_dashboard": False})
    workers = [c.add_node(num_cpus=2, node_ip_address="127.0.0.1") for _ in range(2)]
    yield c, workers
    c.shutdown()


def raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid
