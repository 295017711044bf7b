"""The spread of the director's rollout reward over real rollouts: the team reward (``phase2.group_reward.source:
team``) and I_div (``phase2.diversity``) of every block a phase 2 run's rollouts stage built, overall and within each
prefix's group (what GRPO's advantage sees: a reward constant within a group teaches nothing).

Reads ``RUN/rollouts/prefixes.jsonl`` and ``RUN/rollouts/blocks.jsonl`` (``mascot train collaborative --stage
speakers --stage rollouts`` with ``phase2.group_reward.source: rm``, which builds K blocks per prefix with the serving
director, speakers and simulated user), scores each non-dropped block with the settings' defaults and the support
roster's moves (every support persona, the CPU recipe's roster), and prints one line
per block (persona order, its moves, the three terms, R_group, I_div, R) and the summary: mean, standard deviation,
min and max of R_group and R, the mean within-prefix standard deviation, and the I_div counts.

    python bench/team_reward_spread.py RUN [--eta 0.5] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "services"), str(ROOT / "training-jobs")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a phase 2 run directory (or its rollouts.partial parent)")
    ap.add_argument("--eta", type=float, default=0.5)
    ap.add_argument("--json", type=Path, default=None, help="write the per-block figures here")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from mascot.core.dialogue import history_from_dicts
    from mascot.core.embedding import SentenceEncoder
    from mascot.core.files import read_jsonl
    from mascot.core.moves import assess, round_moves
    from mascot.core.personas import PersonaCatalog
    from mascot_training.collaborative.director_grpo import team_group_reward
    from mascot_training.collaborative.simulate import Prefix
    from mascot_training.common.rewards import i_div, team_terms

    src = a.run / "rollouts" if (a.run / "rollouts").is_dir() else a.run / "rollouts.partial"
    prefixes = {d["prefix_id"]: Prefix.from_dict(d) for d in read_jsonl(src / "prefixes.jsonl")}
    items, meta = [], []
    for row in read_jsonl(src / "blocks.jsonl"):
        for b in row["blocks"]:
            if not b["dropped"] and b["block"] and b["personas"]:
                items.append((prefixes[row["prefix_id"]], history_from_dicts(b["block"])))
                meta.append((row["prefix_id"], b["personas"]))
    if not items:
        raise SystemExit(f"no scored block in {src / 'blocks.jsonl'}")
    roster = PersonaCatalog.load().in_set("support")
    enc = SentenceEncoder(device="cpu")
    r_group = team_group_reward(roster, enc.embed)(items)
    moves = round_moves(roster)
    rows = []
    for (prefix, block), (pid, personas), rg in zip(items, meta, r_group):
        heard = [t.persona_id for t in prefix.history if t.role == "agent"]
        d = i_div(personas, heard=heard)
        terms = team_terms(prefix.history, block, moves, enc.embed)
        user, fired = next((t.text for t in reversed(prefix.history) if t.role == "user"), ""), []
        for t in block:
            if t.role == "agent":
                fired.append(assess(moves, t.text, user).required)
            else:
                user = t.text
        rows.append({"prefix_id": pid, "prefix_agent_turns": len(heard), "personas": personas,
                     "moves": [list(f) for f in fired], "complementarity": terms.complementarity,
                     "relevance": terms.relevance, "redundancy": terms.redundancy, "r_group": rg, "i_div": d,
                     "reward": None if rg is None else rg + a.eta * d})
        print(f"{pid:28s} k={len(heard)} {'/'.join(personas):32s} {fired} C={terms.complementarity:.2f} "
              f"U={terms.relevance if terms.relevance is not None else float('nan'):.2f} "
              f"D={terms.redundancy if terms.redundancy is not None else float('nan'):.2f} "
              f"R_group={rg:.3f} I_div={d:+d}")

    def spread(xs: list[float]) -> str:
        return (f"mean {statistics.fmean(xs):.3f} sd {statistics.pstdev(xs):.3f} min {min(xs):.3f} "
                f"max {max(xs):.3f}")

    rg = [r["r_group"] for r in rows if r["r_group"] is not None]
    rr = [r["reward"] for r in rows if r["reward"] is not None]
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r["r_group"] is not None:
            groups.setdefault(r["prefix_id"], []).append(r["reward"])
    within = [statistics.pstdev(v) for v in groups.values() if len(v) > 1]
    print(f"\n{len(rows)} blocks of {len(groups)} prefixes")
    print(f"R_group: {spread(rg)}")
    print(f"R = R_group + {a.eta}*I_div: {spread(rr)}")
    print(f"within-prefix sd of R: mean {statistics.fmean(within):.3f} over {len(within)} prefixes "
          f"(min {min(within):.3f}, max {max(within):.3f})" if within else "no prefix with two blocks")
    print(f"I_div: +1 x{sum(r['i_div'] == 1 for r in rows)}, -1 x{sum(r['i_div'] == -1 for r in rows)}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
