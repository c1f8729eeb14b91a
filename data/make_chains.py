"""Write data/chains.jsonl, the addition-chain task, from its seed (reasonrl.data.tasks).

    python data/make_chains.py              # rewrites data/chains.jsonl byte for byte
    python data/make_chains.py --out X.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    from reasonrl.data.tasks import make_chains, write_jsonl

    ap = argparse.ArgumentParser(description="Write the bundled addition-chain task (data/chains.jsonl) from its seed.")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "chains.jsonl"), help="where to write (default: chains.jsonl beside this script)")
    a = ap.parse_args(argv)
    rows = make_chains()
    write_jsonl(rows, a.out)
    print(f"{len(rows)} chains -> {a.out}")


if __name__ == "__main__":
    main()
