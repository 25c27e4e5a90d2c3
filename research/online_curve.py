"""The online learning curve of issue 39, as pre-registered in docs/results/online/PREREGISTRATION.md (outside CI;
tests/e2e/test_online_curve.py runs a shrunk version):

    python research/online_curve.py run                    # 200 users, 0/1/2/4/8 pairs -> docs/results/online/
    python research/online_curve.py run --users 4 --points 0 1 --out /tmp/curve   # a quick look
    python research/online_curve.py analyse                # summary, table and plot again from outcomes.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "docs" / "results" / "online"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--recipe", default=str(ROOT / "recipes" / "pgenrm_pipeline.yaml"))
    run.add_argument("--genrm", default=str(ROOT / "models" / "pgenrm_tiny"))
    run.add_argument("--users", type=int, default=None)
    run.add_argument("--points", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    run.add_argument("--borrow-points", type=int, nargs="*", default=[1, 2])
    run.add_argument("--out", type=Path, default=RESULTS)
    run.add_argument("--work", type=Path, default=ROOT / "runs" / "online_curve")
    analyse = sub.add_parser("analyse")
    analyse.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from workers.online_curve import CurveSettings, run_curve, write_results

    if args.command == "run":
        result = run_curve(CurveSettings(recipe=args.recipe, genrm=args.genrm, out=args.work,
                                         points=tuple(args.points), borrow_points=tuple(args.borrow_points),
                                         users=args.users))
    else:
        saved = json.loads((args.out / "outcomes.json").read_text())
        previous = json.loads((args.out / "summary.json").read_text())
        result = {"outcomes": saved["outcomes"], "settings": saved["settings"], "wall_s": previous["wall_s"]}
    summary = write_results(result, args.out)
    print((args.out / "summary.md").read_text())
    print(f"wall time {summary['wall_s']:.0f} s; monotone {summary['monotone']}; within 3 points of the seen "
          f"reference: {summary['goal_within_3']}")


if __name__ == "__main__":
    main()
