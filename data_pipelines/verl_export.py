"""Export shards as verl's RL dataset (parquet): one row per query, the policy prompt as chat messages, and what
the personalized reward needs in ``extra_info`` (user id, query, the top-k profile posts), read back by
``pr_rlhf.integrations.verl.compute_score``.

Rows (verl's fields): ``data_source`` ("pr_rlhf/<subset>"), ``prompt`` (chat messages), ``ability``
("personalization"), ``reward_model`` ({"style": "model", "ground_truth": query}), ``extra_info`` ({"user_id",
"query", "profile": [{"id", "text", "category"}], "subset", "split", "index"}).
Files: ``train.parquet`` (queries of seen users in the train split) and ``test.parquet`` (queries of cold-start
users, or the test split when there are none).

    pr-rlhf data export-verl --shards data/prb --out data/verl_prb --top-k 10
"""
from __future__ import annotations

from pathlib import Path

from pr_rlhf.reward.inputs import policy_messages
from pr_rlhf.shards import ShardReader


def _row(query: dict, top_k: int, split: str, index: int) -> dict:
    posts = [{"id": str(p.get("id", "")), "text": str(p.get("text", "")), "category": str(p.get("category", "") or "")}
             for p in (query.get("retrieved") or [])[:top_k]]
    return {"data_source": f"pr_rlhf/{query['subset']}",
            "prompt": policy_messages(query["question"], posts, top_k),
            "ability": "personalization",
            "reward_model": {"style": "model", "ground_truth": query["question"]},
            "extra_info": {"user_id": query["user_id"], "query": query["question"], "profile": posts,
                           "subset": query["subset"], "split": split, "index": index}}


def export_verl(shards: str | Path, out: str | Path, top_k: int = 10) -> dict[str, int]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out``; returns the row count of each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    reader = ShardReader(str(shards))
    cold = {(r["user_id"], r["subset"]) for r in reader.iter_rows("profiles") if r.get("cold_start")}
    queries = list(reader.iter_rows("queries"))
    train = [q for q in queries if q.get("split") == "train" and (q["user_id"], q["subset"]) not in cold]
    test = ([q for q in queries if (q["user_id"], q["subset"]) in cold] if cold
            else [q for q in queries if q.get("split") == "test"])
    if not train or not test:
        raise ValueError(f"{shards}: {len(train)} training and {len(test)} held-out queries; need both")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, rows in (("train", train), ("test", test)):
        table = pa.Table.from_pylist([_row(q, top_k, name, i) for i, q in enumerate(rows)])
        pq.write_table(table, out / f"{name}.parquet")
        counts[name] = len(rows)
    return counts
