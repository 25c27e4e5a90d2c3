"""`pr-rlhf`: the command line. Imports only typer, rich, pydantic and yaml at start-up (no torch, no Ray), so
`--help` and recipe validation answer fast; heavy modules load inside the command that needs them.

Every command and its name, in the order `--help` lists them; the commands live by topic beside this file and
share one prologue (:mod:`pr_rlhf.cli.prologue`)."""
from __future__ import annotations

import typer

from pr_rlhf.cli import data, evaluation, pgenrm, prologue, quickstart, recipe_checks, report, serve, training

app = typer.Typer(help="pr_rlhf: Ray-distributed RLHF for personalized reward models.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
data_app = typer.Typer(help="Build and inspect Arrow shards of profiles, rubrics and preference pairs.",
                       no_args_is_help=True)
report_app = typer.Typer(help="Reports from finished runs.", no_args_is_help=True)
users_app = typer.Typer(help="The reward service's user store (serve.users): export, import, prototypes.",
                        no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(report_app, name="report")
app.add_typer(users_app, name="users")

for name, command in (("check", recipe_checks.check), ("plan", recipe_checks.plan),
                      ("eval", evaluation.eval_cmd), ("train", training.train), ("rl-sweep", training.rl_sweep),
                      ("train-rm", training.train_rm), ("pgenrm", pgenrm.pgenrm), ("headroom", pgenrm.headroom),
                      ("scaling", evaluation.scaling), ("bon", evaluation.bon),
                      ("leaderboard", evaluation.leaderboard), ("serve-reward", serve.serve_reward),
                      ("quickstart", quickstart.quickstart)):
    app.command(name)(command)
for name, command in (("build", data.data_build), ("export-verl", data.data_export_verl),
                      ("inspect", data.data_inspect)):
    data_app.command(name)(command)
for name, command in (("correlation", report.report_correlation), ("ablation", report.report_ablation),
                      ("compare-rl", report.report_compare_rl), ("compare", report.report_compare)):
    report_app.command(name)(command)
for name, command in (("export", serve.users_export), ("import", serve.users_import),
                      ("prototypes", serve.users_prototypes)):
    users_app.command(name)(command)


def main() -> None:
    app()


__all__ = ["app", "main", "prologue"]   # prologue.read_recipe: the one name every command loads through
