"""What a reward model may see for one pair, built from shard rows, and the blocks that describe the user.

:class:`RMInput` never carries the rubric, the narrative or the record's meta (docs/protocols.md section 1): those are
the evaluation's ground truth. The input modes of docs/protocols.md section 2 map to :func:`user_block`:
``"none"`` shows nothing about the user, ``"profile"`` the top-k retrieved posts (rendered by
:func:`render_profile`), ``"plan"`` the planner's aspects as a numbered list, ``"history"`` the user's earlier
choices (their history pairs: the judge "+ preference history" of SynthesizeMe's and P-GenRM's tables),
``"persona"`` the stated preferences the input carries (a SynthesizeMe persona put there by
:class:`~pr_rlhf.reward.persona.PersonaBook`: SynthesizeMe's "FT RM + persona").
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pr_rlhf.prompts import fragment

InputMode = Literal["none", "profile", "plan", "history", "persona"]
INPUT_MODES: tuple[str, ...] = ("none", "profile", "plan", "history", "persona")


@dataclass
class RMInput:
    pair_id: str
    user_id: str
    subset: str
    question: str
    chosen: str
    rejected: str
    context: list[dict] = field(default_factory=list)          # [{role, content}], ends with the question
    retrieved: list[dict] = field(default_factory=list)        # top-k profile items [{id, text, category, score}]
    history: list[dict] = field(default_factory=list)          # [{question, chosen, rejected}], oldest first
    stated_preferences: str = ""
    plan: list[str] | None = None                              # the planner's aspects (mode "plan")


def _get(row: Any, key: str, default: Any = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(key, default)
    return getattr(row, key, default)


def _lookup(by_user: Mapping[Hashable, Any] | None, user_id: str, subset: str) -> Any:
    """A per-user table entry keyed by ``(user_id, subset)`` or by ``user_id`` alone."""
    if not by_user:
        return None
    for key in ((user_id, subset), user_id):
        if key in by_user:
            return by_user[key]
    return None


def _plain_list(value: Any) -> list:
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes, dict)):
        value = value.tolist()
    return list(value)


def history_rows_by_user(history_rows: Iterable[Any], pair_rows: Iterable[Any]) -> dict[tuple[str, str], list]:
    """``(user_id, subset) -> [pair rows]``: each user's train pairs in the order the histories table lists them.

    Ids listed in a history but absent from ``pair_rows`` are skipped.
    """
    by_id = {str(_get(row, "pair_id")): row for row in pair_rows}
    out: dict[tuple[str, str], list] = {}
    for hist in history_rows:
        key = (str(_get(hist, "user_id")), str(_get(hist, "subset", "")))
        out[key] = [by_id[pid] for pid in map(str, _plain_list(_get(hist, "pair_ids"))) if pid in by_id]
    return out


def rm_inputs_from_rows(pair_rows: Iterable[Any], history_rows_by_user: Mapping[Hashable, Sequence[Any]] | None,
                        profiles_by_user: Mapping[Hashable, Any] | None, k: int) -> list[RMInput]:
    """One :class:`RMInput` per pair row (dicts or record objects).

    ``history_rows_by_user`` maps ``(user_id, subset)`` or ``user_id`` to the user's history pair rows in order
    (see :func:`history_rows_by_user`); the first ``k`` of them, never the evaluated pair itself, become the
    history triples. ``profiles_by_user`` (same keys) supplies ``stated_preferences``; either mapping may be
    None or lack a user.
    """
    out = []
    for row in pair_rows:
        pair_id, user_id, subset = str(_get(row, "pair_id")), str(_get(row, "user_id")), str(_get(row, "subset", ""))
        history = [past for past in _lookup(history_rows_by_user, user_id, subset) or []
                   if str(_get(past, "pair_id")) != pair_id][:max(k, 0)]
        profile = _lookup(profiles_by_user, user_id, subset)
        out.append(rm_input(row, history, str(_get(profile, "stated_preferences", "") or "")
                            if profile is not None else ""))
    return out


def history_triple(past: Any) -> dict[str, str]:
    """A history pair (a shard row, a record or a world pair) as the {question, chosen, rejected} triple RMs read."""
    return {"question": str(_get(past, "question", "")), "chosen": str(_get(past, "chosen", "")),
            "rejected": str(_get(past, "rejected", ""))}


def rm_input(pair: Any, history: Iterable[Any] = (), stated_preferences: str = "") -> RMInput:
    """The :class:`RMInput` of one pair (a shard row, a record or a :class:`~pr_rlhf.world.generator.WorldPair`),
    with ``history`` (the user's earlier pairs, of the same kinds, oldest first) as its history triples."""
    return RMInput(
        pair_id=str(_get(pair, "pair_id")), user_id=str(_get(pair, "user_id")), subset=str(_get(pair, "subset", "")),
        question=str(_get(pair, "question", "")), chosen=str(_get(pair, "chosen", "")),
        rejected=str(_get(pair, "rejected", "")),
        context=[dict(turn) for turn in _plain_list(_get(pair, "context"))],
        retrieved=[dict(item) for item in _plain_list(_get(pair, "retrieved"))],
        history=[history_triple(past) for past in history],
        stated_preferences=stated_preferences,
    )


# ----------------------------------------------------------------------------------------------------------------
# Blocks (headed texts from prompts/user_blocks.txt; "" when there is nothing to show)
# ----------------------------------------------------------------------------------------------------------------

def user_block(inp: RMInput, mode: InputMode, top_k: int) -> str:
    """What the RM sees about the user: nothing, the top-k posts, the planner's aspects, the user's first top-k
    history pairs, or their persona.

    Mode ``"plan"`` needs the planner to have run (``inp.plan`` not None); an empty plan shows nothing.
    """
    if mode == "none":
        return ""
    if mode == "profile":
        return profile_block(inp.retrieved, top_k)
    if mode == "plan":
        if inp.plan is None:
            raise ValueError(f"pair {inp.pair_id!r}: input mode 'plan' needs the planner's aspects (run the "
                             f"Planner and attach them with with_plans first)")
        return plan_block(inp.plan)
    if mode == "history":
        return history_block(inp, top_k)
    if mode == "persona":
        return stated_block(inp)
    raise ValueError(f"unknown input mode {mode!r}; expected one of {INPUT_MODES}")


def history_block(inp: RMInput, k: int | None = None) -> str:
    """The first ``k`` (all when None) history triples as ``User: / Chosen: / Rejected:`` examples."""
    triples = inp.history if k is None else inp.history[:max(k, 0)]
    if not triples:
        return ""
    items = "\n\n".join(fragment("user_blocks", "history_item", index=i, question=t.get("question", ""),
                                 chosen=t.get("chosen", ""), rejected=t.get("rejected", ""))
                        for i, t in enumerate(triples, 1))
    return fragment("user_blocks", "history", items=items)


def stated_block(inp: RMInput) -> str:
    stated = inp.stated_preferences.strip()
    return fragment("user_blocks", "stated", stated=stated) if stated else ""


def conversation_block(inp: RMInput) -> str:
    """Earlier turns of a multi-turn conversation (the final user turn is the question itself, shown apart)."""
    turns = list(inp.context)
    if turns and turns[-1].get("role") == "user" and str(turns[-1].get("content", "")).strip() == inp.question.strip():
        turns = turns[:-1]
    turns = [t for t in turns if str(t.get("content", "")).strip()]
    if not turns:
        return ""
    rendered = "\n".join(fragment("user_blocks", "turn", role=str(t.get("role", "")).capitalize(),
                                  content=t.get("content", "")) for t in turns)
    return fragment("user_blocks", "conversation", turns=rendered)


def render_profile(retrieved: Sequence[Mapping[str, Any]], k: int | None = None) -> str:
    """PRB's prompt block: ``Post i (Category: c):`` then the text on the next line, posts joined by newlines."""
    shown = list(retrieved)[:k] if k is not None else list(retrieved)
    return "\n".join(f"Post {i} (Category: {item.get('category', '')}):\n{item.get('text', '')}"
                     for i, item in enumerate(shown, 1))


def profile_block(retrieved: Sequence[Mapping[str, Any]], top_k: int) -> str:
    """The headed top-k posts block on its own (planner and policy prompts)."""
    posts = render_profile(retrieved, top_k)
    return fragment("user_blocks", "profile", posts=posts) if posts else ""


def plan_block(aspects: Sequence[str]) -> str:
    """The headed, numbered aspects block (RM, policy); "" for an empty plan."""
    if not aspects:
        return ""
    return fragment("user_blocks", "plan", aspects="\n".join(f"{i}. {a}" for i, a in enumerate(aspects, 1)))


def policy_messages(question: str, retrieved: Sequence[Mapping[str, Any]], top_k: int,
                    plan: Sequence[str] | None = None) -> list[dict]:
    """The policy's chat prompt: the question, the user's top-k posts (top_k > 0) and the plan's aspects (RL
    rollouts, Best-of-N pools, the verl export)."""
    from pr_rlhf.prompts import chat

    return chat("policy", profile_block=profile_block(retrieved, top_k) if top_k > 0 else "",
                plan_block=plan_block(plan or []), question=question)


def with_plans(inputs: Sequence[RMInput], plans: Sequence[Any]) -> list[RMInput]:
    """Copies of ``inputs`` carrying each planner result's aspects (a failed plan attaches an empty list)."""
    from dataclasses import replace

    if len(inputs) != len(plans):
        raise ValueError(f"{len(inputs)} inputs but {len(plans)} plans")
    return [replace(inp, plan=list(getattr(plan, "aspects", plan) or [])) for inp, plan in zip(inputs, plans)]
