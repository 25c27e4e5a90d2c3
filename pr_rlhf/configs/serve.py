"""Typed configuration of the reward service (the ``serve:`` section of a recipe). Pydantic only."""
from __future__ import annotations

from pydantic import Field

from pr_rlhf.configs.base import StrictModel
from pr_rlhf.configs.reward import RewardConfig, reward_config


class ServeConfig(StrictModel):
    """One Ray Serve deployment hosting one scorer (any :data:`RewardConfig`: the planner + P-GenRM with optional
    test-time scaling, a scalar RM, a rubric or HTTP judge, the world's gold), behind an HTTP ingress."""

    reward: RewardConfig = Field(default_factory=reward_config, description="what each replica hosts")
    host: str = Field("127.0.0.1", description="bind address; loopback by default (set 0.0.0.0 deliberately)")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0: any free port, printed at start)")
    name: str = Field("pr_rlhf_reward", description="the Serve application name")
    route_prefix: str = "/"
    replicas: int = Field(1, ge=1, description="replicas of the scorer (each loads its own model)")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs per replica")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per replica")
    max_batch_size: int = Field(32, ge=1, description="concurrent requests merged into one scorer call")
    batch_wait_timeout_s: float = Field(0.01, ge=0, description="how long a batch waits to fill")
    max_ongoing_requests: int = Field(64, ge=1, description="requests a replica holds at once (queue beyond)")
    request_timeout_s: float = Field(120.0, gt=0, description="a request not scored by then gets a 504")
    max_pairs_per_request: int = Field(64, ge=1, description="items in one /score or /get_reward call")
    auth_token_env: str | None = Field(None, description="name of an environment variable holding a bearer "
                                                         "token; when set, requests without it get 401 (the token "
                                                         "itself never appears in a recipe or a log)")
