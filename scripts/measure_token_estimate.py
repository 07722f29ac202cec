"""How far the router's default prompt-token estimate (UTF-8 bytes / 4) is from a real tokenizer.

    .venv/bin/python scripts/measure_token_estimate.py --tokenizer PATH/tokenizer.json FILE [FILE ...]

Each file is cut into prompt-sized pieces (paragraphs joined until at least --min-bytes), and
each piece is counted twice: by the estimate (router.prompt_tokens.ESTIMATE, the simulator's
rule) and by the tokenizer (router.prompt_tokens.from_file, the router's --tokenizer path),
both without special tokens. Prints, per file, the pieces, the summed tokens, the estimate's
error on the sum and the per-piece relative error (median, 10th and 90th percentile), and the
tokenizer's CPU time per 1,000 tokens (five more passes, caches warm). Error = estimate / exact - 1 (+: over-estimate).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidegate.router.prompt_tokens import from_file  # noqa: E402
from tidegate.tokens import count_prompt_tokens  # noqa: E402


def pieces(text: str, min_bytes: int) -> list[str]:
    out, cur = [], ""
    for para in text.split("\n\n"):
        cur = f"{cur}\n\n{para}" if cur else para
        if len(cur.encode()) >= min_bytes:
            out.append(cur)
            cur = ""
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="A tokenizer.json (read locally).")
    ap.add_argument("--min-bytes", type=int, default=400, help="Smallest piece, in UTF-8 bytes.")
    ap.add_argument("files", nargs="+", type=Path, help="Text files to measure on.")
    args = ap.parse_args()
    counter = from_file(args.tokenizer)
    assert counter.text_tokens is not None
    print(f"{'file':34} {'pieces':>6} {'exact':>8} {'estimate':>8} {'sum err':>8} "
          f"{'median':>7} {'p10':>7} {'p90':>7} {'us/1k tok':>9}")
    for path in args.files:
        ps = pieces(path.read_text(encoding="utf-8"), args.min_bytes)
        if not ps:
            continue
        exact = [counter.text_tokens(p) for p in ps]  # also warms the tokenizer's caches
        t0 = time.process_time()  # CPU time: what the router's event loop would spend
        for _ in range(5):
            for p in ps:
                counter.text_tokens(p)
        us_per_ktok = (time.process_time() - t0) / (5 * sum(exact)) * 1e9
        est = [count_prompt_tokens(p) for p in ps]
        errs = [e / x - 1 for e, x in zip(est, exact, strict=True) if x]
        print(f"{path.name[:34]:34} {len(ps):6d} {sum(exact):8d} {sum(est):8d} {sum(est) / sum(exact) - 1:+8.1%} "
              f"{statistics.median(errs):+7.1%} {pct(errs, 0.1):+7.1%} {pct(errs, 0.9):+7.1%} {us_per_ktok:9.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
