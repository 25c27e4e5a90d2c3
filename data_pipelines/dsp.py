"""DSP (Domain-Specific Preference; Cheng et al. 2023, "Everyone Deserves A Reward", github.com/Linear95/DSP):
Alpaca instructions answered in the style four "users" prefer (``academy``, ``business``, ``entertainment``,
``literature``) and by Alpaca itself (``normal``).

Data licence: CC-BY-NC-4.0 (the repository's DATA_LICENSE; code Apache-2.0). This project does not ship the data:
build the shards from a local copy of ``data/domain_specific_preference.test.json`` (the 661 queries the repository
holds; its train split is not in the repository) with

    pr-rlhf data build --source dsp --input PATH/domain_specific_preference.test.json --out data/dsp

Raw row: ``{"query": str, "responses": {"academy": str, "business": str, "entertainment": str, "literature": str,
"normal": str}}``. As the DSP repository turns them into pairs, each domain (a user here) prefers its own response
to each of the four others: 4 pairs per query and user. The queries are split by a seeded hash of their text
(``test_share`` to test, the rest train), so a query's pairs sit in one split for every user; each user's train
pairs are their history. A pair with an empty response is left out (counted in the manifest's summary); the
query's other pairs stay. Options: ``test_share`` (default 0.4), ``split_seed`` (0).
"""
from __future__ import annotations

import hashlib

from data_pipelines.raw_io import read_rows, record_id
from pr_rlhf.records import (
    FieldChecker,
    History,
    IssueSink,
    Pair,
    Profile,
    Query,
    SourceOutput,
)

SOURCE = "dsp"
SUBSET = "dsp"
USERS = ("academy", "business", "entertainment", "literature")
RESPONSES = (*USERS, "normal")


def split_of(query: str, test_share: float, seed: int) -> str:
    digest = hashlib.sha256(f"{seed}\x00{query}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2 ** 64 < test_share else "train"


def load(input: str, *, skip_invalid: bool = False, encoding_errors: str = "strict", subsets: list[str] | None = None,
         test_share: float = 0.4, split_seed: int = 0) -> SourceOutput:
    out = SourceOutput()
    sink = IssueSink(skip_invalid, out, encoding_errors)
    history: dict[str, list[str]] = {u: [] for u in USERS}
    empty_pairs = 0
    for index, row in enumerate(read_rows(input, sink)):
        chk = FieldChecker(row.file, record_id(row, "query"), row.data)
        query = chk.text("query")
        responses = row.data.get("responses")
        if not isinstance(responses, dict):
            chk.fail("responses", "wrong_type", "expected an object of the five domains' responses")
            responses = {}
        # an empty response (the file has some) drops only the pairs it is in: the query's other pairs stay
        texts = {d: chk.text(d, value=responses.get(d), path=f"responses.{d}", allow_empty=True) for d in RESPONSES}
        if not sink.accept(chk):
            continue
        split = split_of(query, test_share, split_seed)
        for user in USERS:   # a query record per user: the records' queries each belong to one user
            query_id = f"dsp_q{index:04d}_{user}"
            out.add("queries", Query(query_id=query_id, user_id=user, source=SOURCE, subset=SUBSET, split=split,
                                     question=query))
            for other in RESPONSES:
                if other == user:
                    continue
                if not texts[user].strip() or not texts[other].strip():
                    empty_pairs += 1
                    continue
                pair_id = f"{query_id}_{user}_over_{other}"
                out.add("pairs", Pair(pair_id=pair_id, query_id=query_id, user_id=user, source=SOURCE,
                                      subset=SUBSET, split=split, question=query, chosen=texts[user],
                                      rejected=texts[other]))
                if split == "train":
                    history[user].append(pair_id)
    for user in USERS:
        out.add("profiles", Profile(user_id=user, source=SOURCE, subset=SUBSET))
        out.add("histories", History(user_id=user, source=SOURCE, subset=SUBSET, pair_ids=history[user]))
    out.summary["licence"] = "CC-BY-NC-4.0 (github.com/Linear95/DSP DATA_LICENSE)"
    out.summary["pairs_left_out_for_an_empty_response"] = empty_pairs
    return out
