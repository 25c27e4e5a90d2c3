"""Best-of-N: estimators of best-of-k downstream quality from one pool of N scored samples per prompt."""
