"""Cold-start placement probe: how much could neighbours found by profile posts add for users with one history
pair, offline from the world (the headroom check of test-time scaling's cold-start claim).

For each cold-start user's test pairs (their one train pair as history) it compares deciding by: the user's own
vote rule (most votes, first type on ties); the true type (the ceiling); the majority type of the n seen users
whose profiles (mean MiniLM embedding of their posts) are most similar, each typed by the vote rule on their
3-pair history; the user's own candidate types (those agreeing with the one history pair) with ties broken by
those neighbours' votes; and the same candidates with ties broken by an exact reading of the posts' revealed
directions (what a model that reads posts perfectly could reach).

    python research/cold_start_probe.py recipes/pgenrm_pipeline.yaml
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    import torch

    from pr_rlhf.configs.recipe import load_recipe
    from pr_rlhf.models.embedders import make_embedder
    from pr_rlhf.pgenrm.headroom import bayes_score, held_out_items, type_correct
    from pr_rlhf.pgenrm.oracle_chain import teacher_types, vote_type
    from pr_rlhf.scaling.embedding import profile_vectors
    from pr_rlhf.world.generator import build_world
    from pr_rlhf.world.reference import WorldPrior

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--neighbours", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    args = parser.parse_args()
    torch.set_num_threads(2)
    world = build_world(load_recipe(args.recipe).pgenrm.world)
    prior = WorldPrior.of(world)
    profiles = profile_vectors({u.user_id: [p.text for p in u.posts] for u in world.users}, make_embedder("minilm"))
    seen = [u for u in world.users if not u.cold_start]
    seen_type = {u.user_id: vote_type(world.archetypes, world.history(u.user_id, 3))[2] for u in seen}
    members = np.stack([profiles[u.user_id] for u in seen])
    items = held_out_items(world, "cold", 3)

    def accuracy(pick) -> float:
        return float(np.mean([type_correct(world, prior, it, pick(it)) for it in items]))

    print(f"cold-start pairs: {len(items)}")
    print(f"own vote rule (1 history pair): {accuracy(lambda it: vote_type(world.archetypes, it.history)[2]):.3f}")
    print(f"Bayes (1 history pair): {np.mean([bayes_score(prior, it) for it in items]):.3f}")
    print(f"true type: {accuracy(lambda it: world.user(it.pair.user_id).archetype):.3f}")
    for n in args.neighbours:
        def votes(it, n=n) -> np.ndarray:
            near = np.argsort(-(members @ profiles[it.pair.user_id]))[:n]
            return np.bincount([seen_type[seen[i].user_id] for i in near], minlength=len(world.archetypes))

        def tie_break(it, n=n) -> int:
            v = votes(it, n)
            return max(teacher_types(world.archetypes, it.history, "recent_pair"), key=lambda c: (v[c], -c))
        print(f"n={n}: neighbours' majority type {accuracy(lambda it: int(np.argmax(votes(it)))):.3f}; own "
              f"candidates, ties broken by the neighbours {accuracy(tie_break):.3f}")
    names = world.attribute_names

    def posts_rule(it) -> int:
        score = np.zeros(len(world.archetypes))
        for post in world.user(it.pair.user_id).posts:
            if post.reveals in names:
                score += (1 if post.wants else -1) * np.sign(world.archetypes[:, names.index(post.reveals)])
        return max(teacher_types(world.archetypes, it.history, "recent_pair"), key=lambda c: (score[c], -c))
    print(f"own candidates, ties broken by the posts' revealed directions: {accuracy(posts_rule):.3f}")


if __name__ == "__main__":
    main()
