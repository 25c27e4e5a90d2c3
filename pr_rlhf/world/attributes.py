"""The attribute catalog: what each binary response attribute means, how to measure it, how to render it.

A detector reads *any* text (the world's own answers, or a free-form answer from a policy model), so the gold
utility of every answer is defined by :func:`gold_utility`. Detectors are plain regex/structure rules,
case-insensitive where that makes sense.

Two renderers realize an attribute vector as text:

- :func:`render_compact`: one cue token per attribute (a trigger word for 1, a neutral word for 0), laid out as
  "- " lines when ``structure`` is 1. No distractors: tiny models learn it on CPU in minutes.
- :func:`render_varied`: natural sentences about the query topic, with synonyms and varied order, from an
  :class:`AnswerPlan` drawn once per pair so both answers of a pair share their content and differ only in the
  attributes.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pr_rlhf.configs.world import CATALOG_ORDER, NOT_COMPACT
from pr_rlhf.world.topics import GENERIC_ADVICE, Topic

# "length" is 1 for answers of at least this many words. 100 (PRB's answer budget) leaves room for a short answer
# that realizes every other attribute at once.
LENGTH_THRESHOLD_WORDS = 100

_LIST_LINE = re.compile(r"^\s*(?:[-*\u2022]\s+|\d+[.)]\s+)")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['\u2019][A-Za-z]+)?")


def _matches(pattern: str) -> Callable[[str], int]:
    rx = re.compile(pattern, re.IGNORECASE)
    return lambda text: int(rx.search(text) is not None)


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def _has_list(text: str) -> int:
    # Two list lines make a list; a single dash line is just punctuation.
    return int(sum(1 for line in text.splitlines() if _LIST_LINE.match(line)) >= 2)


@dataclass(frozen=True)
class Attribute:
    name: str
    positive: str                 # rubric aspect when the user wants the attribute
    negative: str                 # rubric aspect when the user wants its absence
    detector: Callable[[str], int]
    compact_on: str = ""          # compact cue token for value 1 (empty: not compact-realizable)
    compact_off: str = ""         # neutral compact token for value 0 (triggers no detector)
    phrases: tuple[str, ...] = ()  # varied realizations of value 1 ({thing}, {example}, {reason})
    reveal_on: tuple[str, ...] = ()   # profile posts revealing a preference for 1 ({topic})
    reveal_off: tuple[str, ...] = ()  # ... for 0
    reason_on: str = ""           # rubric reason templates
    reason_off: str = ""

    def aspect(self, wants: bool) -> str:
        return self.positive if wants else self.negative


CATALOG: dict[str, Attribute] = {a.name: a for a in (
    Attribute(
        "structure", "Organizes the answer as a bulleted or numbered list",
        "Writes in plain prose paragraphs, without lists", _has_list, "steps", "prose",
        reveal_on=("I skim {topic} answers, so bullet points help me a lot.",
                   "Give me {topic} tips as a numbered list and I'm happy."),
        reveal_off=("Bulleted lists feel choppy to me; I prefer {topic} answers written as normal paragraphs.",
                    "I like {topic} advice that reads like a letter, not a slide deck."),
        reason_on="The user scans answers quickly and finds lists easier to follow.",
        reason_off="The user finds lists choppy and prefers flowing prose."),
    Attribute(
        "examples", "Gives concrete examples", "Stays general, without examples",
        _matches(r"\bfor example\b|\bfor instance\b|\be\.g\.|\bsuch as\b"), "e.g.", "abstract",
        phrases=("For example, try {example}.", "For instance, start with {example}.",
                 "Something such as {example} works well.", "A good start is {example}, e.g. on a quiet day."),
        reveal_on=("When I read about {topic}, I want concrete examples.",
                   "{topic} advice only clicks for me when it shows a real example."),
        reveal_off=("I don't need examples in {topic} answers, just the general idea.",
                    "Long lists of {topic} examples bore me; give me the principle."),
        reason_on="The user understands advice best through concrete examples.",
        reason_off="The user wants the general principle without worked examples."),
    Attribute(
        "enthusiasm", "Sounds enthusiastic, with exclamation marks",
        "Keeps a calm, measured tone without exclamation marks", _matches(r"!"), "great!", "calm",
        phrases=("This is a great place to start!", "Enjoy the process!", "It is a lot of fun once it clicks!",
                 "Have fun with it!"),
        reveal_on=("I love it when people get excited about {topic}! Energy is contagious.",
                   "Cheerful {topic} answers make my day!"),
        reveal_off=("Exclamation marks everywhere put me off; I like calm {topic} advice.",
                    "I trust measured, calm {topic} answers more than excited ones."),
        reason_on="The user responds well to energy and encouragement.",
        reason_off="The user is put off by hype and prefers a calm tone."),
    Attribute(
        "second_person", "Addresses the reader directly as 'you'",
        "Stays impersonal, never addressing the reader as 'you'",
        _matches(r"\byou(?:r|rs|rself|rselves)?\b"), "you", "one",
        phrases=("Check your {thing} first.", "Keep your {thing} simple at the start.",
                 "Trust your own pace with {thing}.", "You will see progress with {thing} soon."),
        reveal_on=("I like {topic} advice that speaks to me directly, like a coach would.",
                   "Talk to me, not about people in general, when it comes to {topic}."),
        reveal_off=("I prefer impersonal {topic} write-ups, not 'you should' lectures.",
                    "Being addressed directly in {topic} answers feels pushy to me."),
        reason_on="The user likes advice that speaks to them personally.",
        reason_off="The user prefers an impersonal, report-like voice."),
    Attribute(
        "hedging", "Hedges and acknowledges uncertainty (maybe, probably)",
        "States advice confidently, without hedging",
        _matches(r"\b(?:maybe|perhaps|might|probably|possibly)\b"), "maybe", "surely",
        phrases=("Results might vary a little.", "This will probably take a few tries.",
                 "Perhaps start small and adjust.", "It is possibly easier than it looks.",
                 "Maybe give it a week before judging."),
        reveal_on=("I trust {topic} advice more when people admit what they're unsure about.",
                   "Honest 'it depends' {topic} answers feel more real to me."),
        reveal_off=("Wishy-washy {topic} answers annoy me; just tell me what works.",
                    "I want confident {topic} advice, no hedging."),
        reason_on="The user values honesty about uncertainty.",
        reason_off="The user wants direct, confident advice."),
    Attribute(
        "detail", "Explains the reasons behind the advice", "Gives the advice without explaining why",
        _matches(r"\b(?:because|since|the reason)\b"), "because", "briefly",
        phrases=("This matters because {reason}.", "The reason is that {reason}.", "It helps since {reason}.",
                 "Do it this way because {reason}."),
        reveal_on=("I always want to know why a {topic} tip works, not just what to do.",
                   "Explain the why behind {topic} advice and I'll remember it."),
        reveal_off=("Skip the theory; for {topic}, I just want the steps.",
                    "I don't care why a {topic} tip works, only that it does."),
        reason_on="The user remembers advice better when it comes with its reasons.",
        reason_off="The user wants the steps without the theory."),
    Attribute(
        "summary", "Ends with a short summary (in short, to sum up)", "Skips any closing summary",
        _matches(r"\bin summary\b|\bin short\b|\bto sum up\b|\bin a nutshell\b|\btl;dr\b|\bto summarize\b"),
        "tl;dr", "open",
        phrases=("In short, focus on {thing} first.", "To sum up, keep {thing} simple and steady.",
                 "In a nutshell, start small with {thing}.", "In summary, steady practice with {thing} pays off."),
        reveal_on=("A one-line recap at the end of a {topic} answer helps me remember it.",),
        reveal_off=("No need to recap a {topic} answer at the end; I read it once.",),
        reason_on="The user likes a closing recap to remember the key point.",
        reason_off="The user finds closing recaps redundant."),
    Attribute(
        "casual", "Uses casual, conversational language", "Uses neutral, formal language",
        _matches(r"\b(?:hey|cool|awesome|gonna|wanna|kinda|sorta|yeah|yep|btw|lol)\b"), "yeah", "formal",
        phrases=("Honestly, it's kinda simple once it clicks.", "Yeah, {thing} is the fun bit.",
                 "Cool trick, btw: start with {thing}.", "No need to overthink it, it's gonna be fine."),
        reveal_on=("I like relaxed, chatty {topic} answers, like talking to a friend.",),
        reveal_off=("I prefer a professional tone, even for {topic}.",),
        reason_on="The user likes a relaxed, friendly voice.",
        reason_off="The user prefers a professional register."),
    Attribute(
        "question", "Asks the reader a follow-up question", "Asks no questions back", _matches(r"\?"),
        "right?", "statement",
        phrases=("Which part of {thing} matters most here?", "What is the main goal with {thing}?",
                 "How much time is there each week for {thing}?"),
        reveal_on=("I appreciate it when a {topic} answer asks about my situation.",),
        reveal_off=("Don't ask me questions back, just answer about {topic}.",),
        reason_on="The user likes answers that engage with their situation.",
        reason_off="The user wants an answer, not questions back."),
    Attribute(
        "length", f"Gives a long, thorough answer ({LENGTH_THRESHOLD_WORDS}+ words)",
        f"Keeps the answer short (under {LENGTH_THRESHOLD_WORDS} words)",
        lambda text: int(count_words(text) >= LENGTH_THRESHOLD_WORDS),
        reveal_on=("I enjoy long, thorough {topic} explanations.",),
        reveal_off=("Keep {topic} answers short; I'm busy.",),
        reason_on="The user enjoys thorough answers.",
        reason_off="The user is busy and wants short answers."),
)}

assert tuple(CATALOG) == CATALOG_ORDER, "config.CATALOG_ORDER must mirror the catalog"
assert {n for n, a in CATALOG.items() if not a.compact_on} == NOT_COMPACT


# ---------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------

def detect(text: str, names: Sequence[str] = CATALOG_ORDER) -> dict[str, int]:
    """Measure each named attribute on any text: {name: 0|1}."""
    return {n: CATALOG[n].detector(text) for n in names}


def detect_vector(text: str, names: Sequence[str]) -> np.ndarray:
    return np.array([CATALOG[n].detector(text) for n in names], dtype=np.int64)


def gold_utility(text: str, user_weights: Mapping[str, float]) -> float:
    """The noise-free utility w.x of any answer for a user, with x measured by the detectors."""
    found = detect(text, tuple(user_weights))
    return float(sum(w * found[n] for n, w in user_weights.items()))


# ---------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------

def render_compact(values: Mapping[str, int]) -> str:
    """One token per attribute in the given order; "- " lines when structure is 1 (needs >= 2 attributes)."""
    tokens = [CATALOG[n].compact_on if v else CATALOG[n].compact_off for n, v in values.items()]
    if values.get("structure"):
        return "\n".join(f"- {t}" for t in tokens)
    return " ".join(tokens)


# Sentences that close an answer, in this order; the rest are shuffled among the core sentences.
_CLOSERS = ("summary", "question")
_LIST_INTRO = ("Here are the key points:", "A simple plan:", "Main steps:")


@dataclass
class AnswerPlan:
    """The content both answers of a pair share: core sentences, one phrase per attribute, an order.

    ``order`` ranks every body sentence (core ones by index, attribute ones by name) so that both answers keep
    the same relative order and differ only in the attribute sentences.
    """

    core: list[str]
    short_core: int
    phrases: dict[str, str]
    order: dict[str, float] = field(default_factory=dict)
    intro: str = _LIST_INTRO[0]


def draw_plan(topic: Topic, thing: str, names: Sequence[str], rng: np.random.Generator) -> AnswerPlan:
    advice = list(topic.advice) + [s.format(thing=thing) for s in GENERIC_ADVICE]
    core_idx = rng.permutation(len(topic.advice))
    generic_idx = rng.permutation(len(GENERIC_ADVICE)) + len(topic.advice)
    core = [advice[i] for i in np.concatenate([core_idx, generic_idx])]
    fill = {"thing": thing, "example": str(rng.choice(topic.examples)), "reason": str(rng.choice(topic.reasons))}
    phrases = {n: str(rng.choice(CATALOG[n].phrases)).format(**fill) for n in names if CATALOG[n].phrases}
    keys = [f"core{i}" for i in range(len(core))] + list(phrases)
    order = dict(zip(keys, rng.random(len(keys)).tolist()))
    return AnswerPlan(core=core, short_core=int(rng.integers(2, 4)), phrases=phrases, order=order,
                      intro=str(rng.choice(_LIST_INTRO)))


def render_varied(values: Mapping[str, int], plan: AnswerPlan) -> str:
    """Natural-language answer realizing ``values`` (attributes absent from ``values`` are left unrealized)."""
    wants_long = values.get("length")
    if wants_long is None:
        return _layout(values, plan, plan.short_core)
    if wants_long:
        for n_core in range(plan.short_core, len(plan.core) + 1):
            text = _layout(values, plan, n_core)
            if count_words(text) >= LENGTH_THRESHOLD_WORDS:
                return text
        raise ValueError("not enough content sentences to reach the length threshold")
    for n_core in range(plan.short_core, -1, -1):   # 0 core sentences only when the attributes fill it
        text = _layout(values, plan, n_core)
        if count_words(text) < LENGTH_THRESHOLD_WORDS:
            return text
    raise ValueError("a short answer cannot fit under the length threshold")


def _layout(values: Mapping[str, int], plan: AnswerPlan, n_core: int) -> str:
    body_keys = [f"core{i}" for i in range(n_core)]
    body_keys += [n for n, v in values.items() if v and n in plan.phrases and n not in _CLOSERS]
    body_keys.sort(key=plan.order.__getitem__)
    body = [plan.core[int(k[4:])] if k.startswith("core") else plan.phrases[k] for k in body_keys]
    closers = [plan.phrases[n] for n in _CLOSERS if values.get(n)]
    if values.get("structure"):
        if len(body) < 2:   # a list needs two lines
            body = body + [plan.core[n_core]]
        return "\n".join([plan.intro] + [f"- {s}" for s in body] + closers)
    return " ".join(body + closers)
