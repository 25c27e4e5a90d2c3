"""Test-time user-based scaling of the generative reward model (P-GenRM): several reasoning chains per input, and
neighbour users found through user prototypes (persona embeddings clustered offline, refined on the users'
histories) whose histories score the same pair; the scores are fused into one verdict. Submodules: ``config``
(typed settings), ``prototypes`` (offline index, online neighbour lookup), ``fusion`` and ``scorer`` (chains and
their fusion)."""
