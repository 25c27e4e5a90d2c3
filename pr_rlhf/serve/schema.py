"""Request and response schema of the reward service, and the OpenRLHF remote-RM shape.

``POST /score`` takes one :class:`ScoreItem`; ``POST /score_batch`` takes ``{"items": [...]}``; ``POST
/get_reward`` takes OpenRLHF's ``{"query": [...], "prompts": [...], "labels": [...]}`` (each query is prompt +
response; each label names the user: a user id, or a JSON object with ``user_id`` and optional ``profile``,
``history``, ``plan``, ``reference``) and answers ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``.
Validation errors name the field (FastAPI answers 422 with the field's location).
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pr_rlhf.decoding import decode, find_bad_text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfilePost(_Strict):
    text: str
    id: str = ""
    category: str = ""


class HistoryTriple(_Strict):
    question: str = ""
    chosen: str
    rejected: str


class ScoreItem(_Strict):
    """One thing to score for one user: a response, or a pair of responses (scored against each other)."""

    user_id: str = Field(..., min_length=1)
    query: str = Field(..., min_length=1)
    response: str | None = Field(None, description="the response to score")
    responses: list[str] | None = Field(None, min_length=2, max_length=2,
                                        description="a pair: both scored (a sec_reference GenRM in one chain, a "
                                                    "pairwise judge each against the other)")
    reference: str | None = Field(None, description="what a reward comparing with a reference (a sec_reference or "
                                                    "pairwise GenRM, the persona's pairwise reader) compares a single "
                                                    "response with")
    profile: list[ProfilePost] = Field(default_factory=list, description="retrieved profile posts, best first")
    history: list[HistoryTriple] = Field(default_factory=list, description="the user's past choices")
    plan: list[str] | None = Field(None, description="rubric aspects (skips the planner)")
    stated_preferences: str = ""
    subset: str = ""

    @model_validator(mode="after")
    def _one_target(self) -> ScoreItem:
        if (self.response is None) == (self.responses is None):
            raise ValueError("give exactly one of 'response' (one answer) or 'responses' (a pair)")
        return self

    def meta(self) -> dict[str, Any]:
        """The reward request's ``meta`` (what ``pr_rlhf.scorers.request_input`` reads)."""
        meta: dict[str, Any] = {"subset": self.subset, "stated_preferences": self.stated_preferences,
                                "retrieved": [p.model_dump() for p in self.profile],
                                "history": [h.model_dump() for h in self.history]}
        if self.plan is not None:
            meta["plan"] = list(self.plan)
        reference = self.responses[1] if self.responses is not None else self.reference
        if reference is not None:
            meta["reference"] = reference
        return meta

    @property
    def target(self) -> str:
        return self.responses[0] if self.responses is not None else self.response  # type: ignore[return-value]


class FeedbackItem(_Strict):
    """One preference of one user (``POST /feedback``): appended to the user's stored history. The idempotency
    key makes a retry safe: the same key and content again store nothing; the same key with other content is 409."""

    user_id: str = Field(..., min_length=1, max_length=256)
    query: str = Field(..., min_length=1)
    chosen: str = Field(..., min_length=1)
    rejected: str = Field(..., min_length=1)
    stated_preferences: str = ""
    idempotency_key: str = Field(..., min_length=1, max_length=256)


class FeedbackBatch(_Strict):
    items: list[FeedbackItem] = Field(..., min_length=1)


class ScoreBatch(_Strict):
    items: list[ScoreItem] = Field(..., min_length=1)


class ScoreResult(BaseModel):
    score: float | None = Field(None, description="the response's score (the first of a pair)")
    scores: list[float] | None = Field(None, description="both of a pair (or the response's, and the reference's "
                                                         "for a sec_reference GenRM)")
    status: str = Field("ok", description="'ok', or the failure's kind (parse failures are the model's, not the "
                                          "request's: 200 with no score)")
    error: str | None = None
    persona: str | None = None
    rubric: list[dict] | None = None
    plan: list[str] | None = None
    latency_ms: float = 0.0
    replica: str = ""
    user_state: dict | None = Field(None, description="what the user store supplied: own pairs, the users a "
                                                      "pair was borrowed from, each pair's (user, seq)")


class OpenRLHFRequest(_Strict):
    query: list[str] = Field(..., min_length=1, description="prompt + response, as the trainer decoded them")
    prompts: list[str] | None = None
    labels: list[Any] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> OpenRLHFRequest:
        for name in ("prompts", "labels"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.query):
                raise ValueError(f"'{name}' has {len(value)} entries but 'query' has {len(self.query)}")
        if self.labels is None:
            raise ValueError("'labels' is required: each names the user (a user id or {\"user_id\": ...})")
        return self

    def items(self) -> list[ScoreItem]:
        """One ScoreItem per query: the response is the query after its prompt; the label names the user."""
        out = []
        for i, text in enumerate(self.query):
            prompt = (self.prompts or [""] * len(self.query))[i]
            response = text[len(prompt):] if prompt and text.startswith(prompt) else text
            label = self.labels[i]  # type: ignore[index]
            if isinstance(label, str) and label.lstrip().startswith("{"):
                try:
                    label = json.loads(label)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"labels[{i}]: not valid JSON ({exc.msg})") from None
            fields = dict(label) if isinstance(label, dict) else {"user_id": str(label)}
            fields.setdefault("query", prompt or text)
            try:
                out.append(ScoreItem(response=response, **fields))
            except Exception as exc:
                raise ValueError(f"labels[{i}]: {exc}") from None
        return out


class BodyError(ValueError):
    """A request body that cannot be read: ``field`` is the JSON path of the offending value ("" for the body)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


def read_json_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """A JSON body decoded strictly: invalid UTF-8 (or an escaped lone surrogate) is an error naming the field
    and the byte offset, never a replacement character stored in a user's text; schema errors name their field
    without echoing the value (feedback text stays out of responses and logs)."""
    text, undecodable = decode(raw)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BodyError("", f"not valid JSON: {exc.msg} at character {exc.pos}") from None
    found = find_bad_text(value, text, unit="of the body")
    if found is not None:
        raise BodyError(found[0], f"not valid text: {found[1]}")
    if undecodable:   # undecodable bytes outside any string value
        raise BodyError("", "not valid UTF-8 outside the string values")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise BodyError(".".join(str(p) for p in first["loc"]), first["msg"]) from None
