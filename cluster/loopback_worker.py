"""`ray start` for a worker node that joins a loopback-only head on the same machine (CI, a laptop).

Two Ray rules collide there: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (every listener on 127.0.0.1) `ray start`
refuses to start a worker node at all, and with it set to 1 Ray rewrites a head address of 127.0.0.1 into the
machine's external IP, where the loopback head does not listen. This runs Ray's own CLI with the variable at 1 but
the head address kept as given; with `--node-ip-address 127.0.0.1` every listener of the worker node stays on
loopback too. On real multi-host clusters use plain `ray start --address HEAD_IP:PORT` instead.

    python cluster/loopback_worker.py --address 127.0.0.1:6390 --node-ip-address 127.0.0.1 [ray start options]
"""
import os
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"

import ray._private.services as services  # noqa: E402  (after the variable: Ray reads it at import)
from ray.scripts.scripts import main  # noqa: E402

if "--node-ip-address" not in sys.argv:
    sys.exit("loopback_worker.py: pass --node-ip-address 127.0.0.1 (else the node would listen on the host's IP)")
services.resolve_ip_for_localhost = lambda host: host   # keep 127.0.0.1: the head listens there only
sys.argv = ["ray", "start", *sys.argv[1:]]
sys.exit(main())
