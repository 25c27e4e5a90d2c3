"""TRL reward function: any pr_rlhf reward model as one of ``GRPOTrainer(reward_funcs=[...])``.

TRL calls ``reward(prompts=[...], completions=[...], **columns)`` with the batch's dataset columns and takes one
float per completion. :class:`PersonalizedReward` builds a pr_rlhf reward request per completion -- the user from
the ``user_id`` column, the query from the ``query`` column or the prompt's last user turn, the user's ``history``
(``[{question, chosen, rejected}]``) and ``profile`` posts when the dataset has them -- and scores it:

- in this process with a scorer of :mod:`pr_rlhf.scorers` (``PersonalizedReward(reward={"kind": "pal", ...})``
  or ``scorer=...``), or
- through the running reward service (``PersonalizedReward(url="http://127.0.0.1:8000")``: ``POST /score_batch``,
  retrying connection errors and 503 while it starts, ``pr_rlhf.serve.client``).

A row the adapter cannot turn into a request (no user id, no query) raises naming the column and the row; so does a
completion the reward model could not score, unless ``failure_score`` is given (then it is that value, and
``failures`` counts it): training on a silent 0.0 is never the default.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class PersonalizedReward:
    """A callable for TRL's ``reward_funcs`` (see the module docstring)."""

    def __init__(self, *, reward: Mapping[str, Any] | None = None, scorer: Any = None, url: str | None = None,
                 token: str | None = None, user_column: str = "user_id", query_column: str = "query",
                 history_column: str = "history", profile_column: str = "profile",
                 failure_score: float | None = None, name: str = "pr_rlhf_reward") -> None:
        if sum(x is not None for x in (reward, scorer, url)) != 1:
            raise ValueError("give exactly one of reward= (a reward config), scorer= or url= (the reward service)")
        self.__name__ = name   # TRL logs each reward function under its name
        self.user_column, self.query_column = user_column, query_column
        self.history_column, self.profile_column = history_column, profile_column
        self.failure_score = failure_score
        self.failures = 0
        self.client = None
        if url is not None:
            from pr_rlhf.serve.client import ServiceClient

            self.client = ServiceClient(url, token=token)
        elif reward is not None:
            from pr_rlhf.configs.reward import reward_config
            from pr_rlhf.scorers import build_scorer

            scorer = build_scorer(reward_config(**reward))
        self.scorer = scorer

    @staticmethod
    def _text(value: Any) -> str:
        """A plain or conversational (``[{role, content}]``) prompt / completion as text: the last user turn of a
        prompt, the assistant's content of a completion."""
        if isinstance(value, str):
            return value
        if isinstance(value, Sequence):
            turns = [t for t in value if isinstance(t, Mapping)]
            users = [t for t in turns if t.get("role") == "user"] or turns
            return str(users[-1].get("content", "")) if users else ""
        return ""

    def _items(self, prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Any]) -> list[dict]:
        users = columns.get(self.user_column)
        if users is None:
            raise ValueError(f"pr_rlhf reward: the dataset has no {self.user_column!r} column (whose reward is it?); "
                             f"it has {sorted(columns)}")
        queries = columns.get(self.query_column)
        items = []
        for i, completion in enumerate(completions):
            user = users[i]
            query = queries[i] if queries is not None else self._text(prompts[i])
            if not user or not str(query).strip():
                raise ValueError(f"pr_rlhf reward: row {i} has no {'user id' if not user else 'query'} "
                                 f"({self.user_column}={user!r}, {self.query_column}={str(query)[:40]!r})")
            item = {"user_id": str(user), "query": str(query), "response": self._text(completion)}
            for column, field in ((self.history_column, "history"), (self.profile_column, "profile")):
                value = columns.get(column)
                if value is not None and value[i]:
                    item[field] = list(value[i])
            items.append(item)
        return items

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        items = self._items(prompts, completions, columns)
        if self.client is not None:
            results = self.client.post("/score_batch", {"items": items})["results"]
            scores = [(r.get("score"), r.get("status")) for r in results]
        else:
            from pr_rlhf.scorers import RewardRequest

            requests = [RewardRequest(str(i), it["user_id"], it["query"], it["response"],
                                      {"history": it.get("history", []), "retrieved": it.get("profile", [])})
                        for i, it in enumerate(items)]
            scores = self.scorer.score(requests)
        out = []
        for i, (score, error) in enumerate(scores):
            if score is None:
                if self.failure_score is None:
                    raise RuntimeError(f"pr_rlhf reward: completion {i} (user {items[i]['user_id']!r}) was not "
                                       f"scored: {error} (failure_score= would score such completions instead)")
                self.failures += 1
                score = self.failure_score
            out.append(float(score))
        return out
