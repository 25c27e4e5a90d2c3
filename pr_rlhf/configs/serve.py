"""Typed configuration of the reward service (the ``serve:`` section of a recipe). Pydantic only."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pr_rlhf.configs.base import StrictModel
from pr_rlhf.configs.reward import RewardConfig, reward_config


class UserStoreConfig(StrictModel):
    """The service's per-user state (``serve.users``): feedback pairs kept per user and read back at scoring time
    (``pr_rlhf.serve.users``, ``pr_rlhf.serve.personalize``)."""

    url: str = Field("sqlite:///runs/serve/users.sqlite", description="SQLAlchemy URL; the default SQLite file "
                     "(WAL) serves replicas on one machine, a shared database (postgresql://...) replicas on several")
    history_pairs: int = Field(3, ge=1, description="pairs a scoring request gets from the store (the protocol's "
                                                    "history size)")
    selection: Literal["recent", "relevant"] = Field("recent", description="which stored pairs: the most recent, "
                                                     "or the most relevant to the query (BM25), kept in arrival order")
    profile_items: int = Field(10, ge=0, description="stored chosen answers shown as profile posts (most relevant "
                                                     "first) to a scorer in profile mode (the BT RM w/ profile)")
    embedder: str | None = Field("minilm", description="embeds each feedback (chosen minus rejected) to place the "
                                                       "user among the prototypes; null: no placement")
    prototypes: str | None = Field(None, description="a prototype index over feedback vectors (`pr-rlhf users "
                                                     "prototypes`); null: users are not placed")
    neighbours: int = Field(0, ge=0, description="a user with fewer than history_pairs own pairs borrows the latest "
                                                 "pair of up to this many users of their prototype, most similar "
                                                 "first (0: off)")
    max_text_chars: int = Field(8000, ge=1, description="longest query / chosen / rejected / stated text accepted")
    max_history_read: int = Field(64, ge=1, description="stored pairs read per user for the 'relevant' selection")


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
    tenant_tokens_env: dict[str, str] = Field(default_factory=dict, description="tenant -> name of an environment "
                                              "variable holding that tenant's bearer token: a token reads and "
                                              "writes its own tenant's users only")
    users: UserStoreConfig | None = Field(None, description="the per-user store (POST /feedback, GET and DELETE "
                                                            "/users/{id}); null: the service keeps no user state")

    @model_validator(mode="after")
    def _tenants_need_users(self) -> ServeConfig:
        if self.tenant_tokens_env and self.users is None:
            raise ValueError("tenant_tokens_env scopes the user store: set serve.users too")
        return self
