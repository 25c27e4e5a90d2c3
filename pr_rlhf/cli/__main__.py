"""`python -m pr_rlhf.cli ...`: the same command line as `pr-rlhf ...`."""
from pr_rlhf.cli import main

main()
