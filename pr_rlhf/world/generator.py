"""Generate the synthetic persona world from a :class:`WorldConfig`: archetypes, users, pairs, profiles, rubrics.

Ground truth: user u has weights w_u = archetype_k + N(0, user_noise^2); an answer with attribute vector x has
realized utility w_u.x + N(0, utility_noise^2); of two answers the chosen one has the higher realized utility.

Every random draw comes from a numpy Generator seeded by (config.seed, stream, index...), so one user's data
does not change when another knob (say the number of users, or the rendering) changes, and the attribute
vectors and utilities are identical across the two renderings.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pr_rlhf.configs.world import WorldConfig
from pr_rlhf.world.attributes import CATALOG, detect, draw_plan, gold_utility, render_compact, render_varied
from pr_rlhf.world.topics import GENERIC_NARRATIVES, SUBSETS, TOPICS, Topic, topics_of

_STREAMS = {"archetypes": 1, "user": 2, "pairs": 3, "text": 4, "profile": 5, "oracle": 6, "bootstrap": 7,
            "shared": 8}


def stream(seed: int, name: str, *index: int) -> np.random.Generator:
    """An independent Generator per (seed, stream name, indices): no global random state anywhere."""
    return np.random.default_rng([seed, _STREAMS[name], *index])


@dataclass
class ProfilePost:
    id: str
    text: str
    category: str
    reveals: str | None = None     # attribute name this post reveals a preference about
    wants: bool | None = None      # direction of that preference


@dataclass
class RubricItem:
    attribute: str
    wants: bool
    weight: float
    aspect: str
    evidence: str
    evidence_id: str
    reason: str


@dataclass
class WorldUser:
    user_id: str
    index: int
    archetype: int
    weights: np.ndarray
    subset: str
    cold_start: bool
    posts: list[ProfilePost] = field(default_factory=list)


@dataclass
class WorldPair:
    pair_id: str
    user_id: str
    split: str
    subset: str
    topic: str
    question: str
    thing: str
    narrative: str
    chosen: str
    rejected: str
    x_chosen: tuple[int, ...]
    x_rejected: tuple[int, ...]
    u_chosen: float
    u_rejected: float
    hardness: str
    flip: bool
    rubric: list[RubricItem] = field(default_factory=list)

    @property
    def differing(self) -> np.ndarray:
        """x_chosen - x_rejected, the feature of a preference under the linear utility."""
        return np.asarray(self.x_chosen, dtype=np.float64) - np.asarray(self.x_rejected, dtype=np.float64)


@dataclass
class World:
    config: WorldConfig
    attribute_names: tuple[str, ...]
    archetypes: np.ndarray                       # (n_archetypes, K)
    users: list[WorldUser]
    pairs: list[WorldPair]
    _by_user: dict[str, WorldUser] = field(default_factory=dict, repr=False)
    _pairs_by_user: dict[str, list[WorldPair]] = field(default_factory=dict, repr=False)
    _reference_cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_user = {u.user_id: u for u in self.users}
        self._pairs_by_user = {u.user_id: [] for u in self.users}
        for p in self.pairs:
            self._pairs_by_user[p.user_id].append(p)

    # -- lookups ---------------------------------------------------------------------------------------------
    def user(self, user_id: str) -> WorldUser:
        return self._by_user[user_id]

    def pairs_of(self, user_id: str, split: str | None = None) -> list[WorldPair]:
        return [p for p in self._pairs_by_user[user_id] if split is None or p.split == split]

    def history(self, user_id: str, size: int | None = None) -> list[WorldPair]:
        """The user's train pairs in order (the first ``size`` of them)."""
        return self.pairs_of(user_id, "train")[:size]

    def user_weights(self, user_id: str) -> dict[str, float]:
        return dict(zip(self.attribute_names, self.user(user_id).weights.tolist()))

    # -- measuring any text ----------------------------------------------------------------------------------
    def detect(self, text: str) -> dict[str, int]:
        """The world's attributes measured on any text."""
        return detect(text, self.attribute_names)

    def gold_utility(self, text: str, user: str | Mapping[str, float] | Sequence[float] | np.ndarray) -> float:
        """Noise-free utility w.x of any text for a user (a user id, a {name: weight} map, or a weight vector)."""
        return gold_utility(text, self._weights_map(user))

    def _weights_map(self, user: Any) -> dict[str, float]:
        if isinstance(user, str):
            return self.user_weights(user)
        if isinstance(user, Mapping):
            return {str(k): float(v) for k, v in user.items()}
        return dict(zip(self.attribute_names, np.asarray(user, dtype=float).tolist()))

    # -- reporting -------------------------------------------------------------------------------------------
    def summary(self) -> dict:
        """Counts per split/subset/hardness and cold-start users (the reference accuracies:
        :func:`pr_rlhf.world.reference.reference_summary`)."""
        def count(key) -> dict[str, int]:
            out: dict[str, int] = {}
            for p in self.pairs:
                out[key(p)] = out.get(key(p), 0) + 1
            return dict(sorted(out.items()))

        n_hard = sum(p.hardness == "hard" for p in self.pairs)
        out = {
            "attributes": list(self.attribute_names),
            "rendering": self.config.rendering,
            "users": sum(not u.cold_start for u in self.users),
            "cold_start_users": sum(u.cold_start for u in self.users),
            "pairs": len(self.pairs),
            "pairs_per_split": count(lambda p: p.split),
            "pairs_per_subset": count(lambda p: p.subset),
            "users_per_subset": dict(sorted({s: sum(u.subset == s for u in self.users) for s in SUBSETS}.items())),
            "hard_pairs": n_hard,
            "hard_share": n_hard / max(1, len(self.pairs)),
            "profile_posts_mean": float(np.mean([len(u.posts) for u in self.users])) if self.users else 0.0,
        }
        return out


# ---------------------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------------------

def build_world(config: WorldConfig | None = None) -> World:
    """Generate the whole world; the same config always gives the identical world."""
    config = config or WorldConfig()
    names = config.attribute_names
    archetypes = draw_archetypes(config)
    users: list[WorldUser] = []
    pairs: list[WorldPair] = []
    for index in range(config.users + config.cold_start_users):
        user = _draw_user(config, archetypes, index)
        user.posts = _draw_profile(config, user, names)
        users.append(user)
        pairs.extend(_draw_pairs(config, user, names))
    return World(config=config, attribute_names=names, archetypes=archetypes, users=users, pairs=pairs)


def draw_archetypes(config: WorldConfig) -> np.ndarray:
    """Archetype weight vectors ~N(0, scale^2), centred across archetypes so the population mean is zero, plus
    an optional shared vector ~N(0, shared_preference^2) that every archetype gets (the population's consensus).

    Centring makes personalization necessary (no answer style is preferred by everyone); the factor
    sqrt(A/(A-1)) restores the entries' expected variance after centring.
    """
    k, a = len(config.attribute_names), config.n_archetypes
    raw = stream(config.seed, "archetypes").normal(0.0, 1.0, size=(a, k))
    if a > 1:
        raw = (raw - raw.mean(axis=0, keepdims=True)) * np.sqrt(a / (a - 1))
    shared = stream(config.seed, "shared").normal(0.0, config.shared_preference, size=k) \
        if config.shared_preference > 0 else np.zeros(k)
    return raw * config.archetype_scale + shared


def user_id_of(index: int) -> str:
    return f"u{index:04d}"


def _draw_user(config: WorldConfig, archetypes: np.ndarray, index: int) -> WorldUser:
    rng = stream(config.seed, "user", index)
    archetype = int(rng.integers(config.n_archetypes))
    weights = archetypes[archetype] + config.user_noise * rng.normal(size=archetypes.shape[1])
    subset = SUBSETS[int(rng.integers(len(SUBSETS)))]
    return WorldUser(user_id=user_id_of(index), index=index, archetype=archetype, weights=weights,
                     subset=subset, cold_start=index >= config.users)


def _splits_of(config: WorldConfig, cold_start: bool) -> list[str]:
    if cold_start:
        return ["train"] * config.cold_start_history + ["test"] * config.cold_start_test_pairs
    return (["train"] * config.history_size + ["val"] * config.val_pairs_per_user
            + ["test"] * config.test_pairs_per_user)


def _draw_pairs(config: WorldConfig, user: WorldUser, names: tuple[str, ...]) -> list[WorldPair]:
    rng = stream(config.seed, "pairs", user.index)
    k = len(names)
    # A user's questions come from their subset, without repeats until all of them have been asked.
    questions = [(t, q, thing) for t in topics_of(user.subset) for q, thing in t.questions]
    order = rng.permutation(len(questions))
    out = []
    for j, split in enumerate(_splits_of(config, user.cold_start)):
        topic, question, thing = questions[order[j % len(order)]]
        narratives = topic.narratives + GENERIC_NARRATIVES
        narrative = _capitalize_sentences(
            narratives[int(rng.integers(len(narratives)))].format(thing=thing, topic=topic.name))
        hard = bool(rng.random() < config.hard_negative_share)
        n_diff = 1 if hard else int(rng.integers(config.min_differing_attributes,
                                                 config.max_differing_attributes + 1))
        x_a = rng.integers(0, 2, size=k)
        x_b = x_a.copy()
        flipped = rng.choice(k, size=n_diff, replace=False)
        x_b[flipped] = 1 - x_b[flipped]
        u_a = float(user.weights @ x_a + config.utility_noise * rng.normal())
        u_b = float(user.weights @ x_b + config.utility_noise * rng.normal())
        flip = bool(rng.random() < 0.5)
        (x_c, u_c), (x_r, u_r) = ((x_a, u_a), (x_b, u_b)) if u_a >= u_b else ((x_b, u_b), (x_a, u_a))
        chosen, rejected = _render_pair(config, names, topic, thing, x_c, x_r,
                                        stream(config.seed, "text", user.index, j))
        out.append(WorldPair(
            pair_id=f"syn_{user.user_id}_q{j:04d}", user_id=user.user_id, split=split, subset=user.subset,
            topic=topic.name, question=question, thing=thing, narrative=narrative, chosen=chosen,
            rejected=rejected, x_chosen=tuple(int(v) for v in x_c), x_rejected=tuple(int(v) for v in x_r),
            u_chosen=u_c, u_rejected=u_r, hardness="hard" if hard else "standard", flip=flip,
            rubric=_rubric(config, user, names, topic)))
    return out


def _render_pair(config: WorldConfig, names: tuple[str, ...], topic: Topic, thing: str, x_c: np.ndarray,
                 x_r: np.ndarray, rng: np.random.Generator) -> tuple[str, str]:
    values_c = dict(zip(names, (int(v) for v in x_c)))
    values_r = dict(zip(names, (int(v) for v in x_r)))
    if config.rendering == "compact":
        return render_compact(values_c), render_compact(values_r)
    plan = draw_plan(topic, thing, names, rng)   # shared: the two answers differ only in their attributes
    return render_varied(values_c, plan), render_varied(values_r, plan)


def _draw_profile(config: WorldConfig, user: WorldUser, names: tuple[str, ...]) -> list[ProfilePost]:
    """Posts: a share reveal a preference (attribute drawn proportionally to |weight|), the rest is chatter.

    Chatter is drawn without replacement (mostly from the user's own subset) so that no two posts repeat; a
    revealing post that would repeat an earlier one becomes chatter instead.
    """
    rng = stream(config.seed, "profile", user.index)
    own = list(topics_of(user.subset))
    pool = [(t.name, s, t.subset == user.subset) for t in TOPICS for s in t.chatter]
    # Random order with the user's own subset favoured: mostly on-topic chatter, a few posts from elsewhere.
    keys = rng.random(len(pool)) + np.array([0.0 if mine else 0.6 for _, _, mine in pool])
    chatter = [(name, text) for (name, text, _), _k in sorted(zip(pool, keys), key=lambda item: item[1])]
    magnitude = np.abs(user.weights)
    probs = magnitude / magnitude.sum() if magnitude.sum() > 0 else np.full(len(names), 1 / len(names))
    n_posts = int(rng.integers(config.profile_posts_min, config.profile_posts_max + 1))
    posts: list[ProfilePost] = []
    seen: set[str] = set()
    for i in range(n_posts):
        post_id = f"{user.user_id}_p{i:02d}"
        if rng.random() < config.reveal_share:
            j = int(rng.choice(len(names), p=probs))
            attr, wants = CATALOG[names[j]], bool(user.weights[j] > 0)
            templates = attr.reveal_on if wants else attr.reveal_off
            topic = own[int(rng.integers(len(own)))]
            text = _capitalize_sentences(templates[int(rng.integers(len(templates)))].format(topic=topic.label))
            if text not in seen:
                posts.append(ProfilePost(post_id, text, topic.name, reveals=attr.name, wants=wants))
                seen.add(text)
                continue
        while chatter and chatter[0][1] in seen:
            chatter.pop(0)
        if not chatter:
            break
        category, text = chatter.pop(0)
        posts.append(ProfilePost(post_id, text, category))
        seen.add(text)
    return posts


def _rubric(config: WorldConfig, user: WorldUser, names: tuple[str, ...], topic: Topic) -> list[RubricItem]:
    """The user's strongest attributes (by |weight|) with direction; evidence = a post revealing it, if any."""
    order = sorted(range(len(names)), key=lambda j: (-abs(user.weights[j]), j))[: config.rubric_aspects]
    items = []
    for j in order:
        attr, wants = CATALOG[names[j]], bool(user.weights[j] > 0)
        revealing = [p for p in user.posts if p.reveals == attr.name]
        revealing.sort(key=lambda p: p.category != topic.name)   # prefer a post on the query's topic
        evidence = revealing[0] if revealing else None
        reason = (attr.reason_on if wants else attr.reason_off).rstrip(".")
        reason += " (stated in a profile post)." if evidence else " (seen in the user's past choices)."
        items.append(RubricItem(attribute=attr.name, wants=wants, weight=float(user.weights[j]),
                                aspect=attr.aspect(wants), evidence=evidence.text if evidence else "",
                                evidence_id=evidence.id if evidence else "", reason=reason))
    return items


def _capitalize_sentences(text: str) -> str:
    return re.sub(r"(^|[.!?]\s+)([a-z])", lambda m: m.group(1) + m.group(2).upper(), text)
