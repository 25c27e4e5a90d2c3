"""Test-time user-based scaling of the generative reward model (P-GenRM): several reasoning chains per input, and
neighbour users found through user prototypes (persona embeddings clustered offline, refined on the users'
histories) whose histories score the same pair; the scores are fused into one verdict (settings:
:mod:`pr_rlhf.configs.scaling`). Submodules: the prototypes' ``embedding`` (persona vectors), ``kmeans``,
``refine`` (refinement on the users' histories), ``index`` (online neighbour lookup, saved artifacts) and
``build`` (the offline build of an index), with ``validation`` (their input checks); ``fusion`` and ``scorer``
(chains and their fusion); ``grid`` (the (m, n) accuracy grid)."""
