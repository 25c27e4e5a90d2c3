"""The reward service: `pr-rlhf serve-reward` (a Ray Serve endpoint) and `pr-rlhf users export | import |
prototypes` (its user store)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from pr_rlhf.cli.prologue import AddressOpt, OverridesOpt, RecipeCommand, console, fail, open_recipe

SERVE_REWARD = RecipeCommand("serve-reward", ("serve",), "recipes/serve_reward.yaml")
USERS = RecipeCommand("users", ("serve.users",), "recipes/serve_online.yaml")


def serve_reward(recipe: Path = typer.Argument(..., help="recipe YAML with a serve: section"),
                 overrides: Optional[List[str]] = OverridesOpt,
                 port: Optional[int] = typer.Option(None, help="HTTP port (default: serve.port)"),
                 address: Optional[str] = AddressOpt,
                 detach: bool = typer.Option(False, help="return once deployed (the service stays on the cluster "
                                                         "until `serve shutdown`)")) -> None:
    """The personalized reward as a Ray Serve endpoint (127.0.0.1 by default): /score, /score_batch, OpenRLHF's
    /get_reward, /health. Ctrl-C stops it."""
    cfg = open_recipe(SERVE_REWARD, recipe, overrides, options={"serve.port": port}).serve
    if cfg.auth_token_env and not os.environ.get(cfg.auth_token_env):
        fail(f"serve.auth_token_env={cfg.auth_token_env!r}: that environment variable is empty; export the token "
             "first (it is read from the environment only, never from the recipe)")
    for tenant, env in cfg.tenant_tokens_env.items():
        if not os.environ.get(env):
            fail(f"serve.tenant_tokens_env: tenant {tenant!r}'s variable {env!r} is empty; export its token first")
    from workers.reward_service import run_reward_service

    auth = f", bearer token from ${cfg.auth_token_env}" if cfg.auth_token_env else ""

    def ready(url: str) -> None:
        console.print(f"reward service ({cfg.reward.kind}, {cfg.replicas} replica(s){auth}) at {url}  "
                      f"[POST /score, /score_batch, /get_reward; GET /health]"
                      + (" [POST /feedback; GET, DELETE /users/{id}]" if cfg.users is not None else ""),
                      highlight=False)
        sys.stdout.flush()   # seen at once when the output goes to a file or a pipe

    def stopping() -> None:
        console.print("stopping the reward service")
        sys.stdout.flush()   # before the shutdown, which may take a while on a busy machine

    run_reward_service(cfg, address, detach=detach, on_ready=ready, on_stop=stopping)


def _store_url(url: Optional[str], recipe: Optional[Path]) -> str:
    if (url is None) == (recipe is None):
        fail("give --url (a SQLAlchemy URL) or --recipe (its serve.users.url), one of them")
    if url is not None:
        return url
    return open_recipe(USERS, recipe, None).serve.users.url


UrlOpt = typer.Option(None, "--url", help="the store's SQLAlchemy URL (sqlite:///path or postgresql+pg8000://...)")
RecipeOpt = typer.Option(None, "--recipe", help="a recipe whose serve.users.url names the store")


def users_export(out: Path = typer.Argument(..., help="JSONL file to write (one feedback per line)"),
                 url: Optional[str] = UrlOpt, recipe: Optional[Path] = RecipeOpt,
                 tenant: Optional[str] = typer.Option(None, help="one tenant only (default: all)")) -> None:
    """Every stored feedback, in each user's order, with its tenant and idempotency key."""
    from pr_rlhf.files import atomic_write_text
    from pr_rlhf.serve.users import UserStore

    store = UserStore(_store_url(url, recipe))
    rows = [json.dumps(r, ensure_ascii=False) for r in store.export_jsonl(tenant)]
    atomic_write_text(out, "".join(r + "\n" for r in rows))
    console.print(f"exported {len(rows)} feedback rows of {store.count(tenant)[0]} users to {out}", highlight=False)


def users_import(path: Path = typer.Argument(..., help="a JSONL export"), url: Optional[str] = UrlOpt,
                 recipe: Optional[Path] = RecipeOpt) -> None:
    """Replay an export into a store (safe to repeat: the idempotency keys come along)."""
    from pr_rlhf.serve.users import UserStore, import_jsonl

    try:
        stored, duplicates = import_jsonl(UserStore(_store_url(url, recipe)), path)
    except (OSError, ValueError) as exc:
        fail(str(exc))
    console.print(f"imported {stored} feedback rows ({duplicates} already stored) from {path}", highlight=False)


def users_prototypes(out: Path = typer.Argument(..., help="folder for the prototype index"),
                     url: Optional[str] = UrlOpt, recipe: Optional[Path] = RecipeOpt,
                     tenant: str = typer.Option("default", help="whose users"),
                     k: int = typer.Option(8, help="prototypes"), seed: int = typer.Option(0),
                     embedder: str = typer.Option("minilm", help="what embeds each feedback")) -> None:
    """K-means over the stored users' mean feedback vectors: the index serve.users.prototypes places arriving
    users with (one lookup per feedback)."""
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.serve.personalize import build_feedback_prototypes
    from pr_rlhf.serve.users import UserStore

    histories: dict[str, list[tuple[str, str]]] = {}
    for row in UserStore(_store_url(url, recipe)).export_jsonl(tenant):
        histories.setdefault(row["user_id"], []).append((row["chosen"], row["rejected"]))
    try:
        index = build_feedback_prototypes(histories, make_embedder(embedder, cache=False), k, seed=seed)
    except ValueError as exc:
        fail(str(exc))
    index.save(out)
    console.print(f"{k} prototypes over {len(histories)} users written to {out}", highlight=False)


