#!/usr/bin/env python3
"""Markdown tables from the last `cargo bench --bench try_acquire` run.

    python3 benches/summarize.py [CRITERION_DIR]

CRITERION_DIR defaults to $CARGO_TARGET_DIR/criterion, else target/criterion next to this crate.
Reads every <group>/<function>/new/{benchmark,estimates}.json and prints, per benchmark, the median
(criterion's point estimate and its 95% confidence interval) and three ratios:

- x gov default: to `governor/default_clock` in the same group (governor's default QuantaClock);
- x gov same clock: to governor on the same kind of clock (upkeep: quanta's 1 ms upkeep clock;
  monotonic: std Instant; quanta: QuantaClock);
- x floor: to `floor/<clock>` (load + clock read + uncontended CAS) for single-thread rows and for
  reject_2t (rejections write nothing, so there is no contention); for admit_2t, to
  `admit_2t/floor/<clock>`, the same floor with both threads on one word, measured in the same run.

Then a reject-vs-admit table per algorithm. Only the standard library is used.
"""

import json
import os
import sys
from pathlib import Path

GROUP_ORDER = ["clock", "floor", "admit_1t", "reject_1t", "admit_2t", "reject_2t"]
GOV_DEFAULT = "governor/default_clock"
GOV_BY_CLOCK = {
    "upkeep": "governor/upkeep_clock",
    "quanta_upkeep": "governor/upkeep_clock",
    "monotonic": "governor/monotonic_clock",
    "quanta": "governor/default_clock",
}
ALGORITHMS = ["fixed_window", "sliding_window", "sliding_counter", "token_bucket"]


def criterion_dir() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        return Path(target) / "criterion"
    return Path(__file__).resolve().parent.parent / "target" / "criterion"


def load(root: Path) -> dict:
    """{(group, function): (median_ns, low_ns, high_ns)}"""
    results = {}
    for bench in root.glob("**/new/benchmark.json"):
        meta = json.loads(bench.read_text())
        estimates = json.loads((bench.parent / "estimates.json").read_text())
        median = estimates["median"]
        function = meta["function_id"] or ""
        if meta.get("value_str"):
            function = f"{function}/{meta['value_str']}"
        ci = median["confidence_interval"]
        results[(meta["group_id"], function)] = (
            median["point_estimate"],
            ci["lower_bound"],
            ci["upper_bound"],
        )
    return results


def clock_of(group: str, function: str):
    """The clock a benchmark reads, as named by the floor group."""
    if group == "clock":
        return None
    if group == "floor" or function.startswith("floor/"):
        return function.removeprefix("floor/").split("/")[0]
    if function.startswith("governor/"):
        return {
            "default_clock": "quanta",
            "upkeep_clock": "quanta_upkeep",
            "monotonic_clock": "monotonic",
        }[function.split("/", 1)[1]]
    if "@" in function:
        return function.split("@", 1)[1]
    return "upkeep"


def ratio(value, peer) -> str:
    return "—" if peer is None else f"{value / peer:.2f}×"


def ns(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def sort_key(item):
    (group, function), _ = item
    g = GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)
    return (g, not function.startswith("floor/"), function.startswith("governor/"), function)


def main() -> None:
    root = criterion_dir()
    results = load(root)
    if not results:
        sys.exit(f"no criterion results under {root}")

    def median(group, function):
        r = results.get((group, function))
        return None if r is None else r[0]

    print(f"<!-- from {root} -->")
    print("| benchmark | clock | median ns [95% CI] | × gov default | × gov same clock | × floor |")
    print("|---|---|---|---|---|---|")
    for (group, function), (med, low, high) in sorted(results.items(), key=sort_key):
        clock = clock_of(group, function)
        is_peer_group = group in ("admit_1t", "reject_1t", "admit_2t", "reject_2t")
        gov = median(group, GOV_DEFAULT) if is_peer_group else None
        same = None
        if is_peer_group and not function.startswith("governor/") and clock in GOV_BY_CLOCK:
            same = median(group, GOV_BY_CLOCK[clock])
        floor = None
        if group in ("admit_1t", "reject_1t", "reject_2t") and clock:
            floor = median("floor", clock)
        elif group == "admit_2t" and clock and not function.startswith("floor/"):
            floor = median("admit_2t", f"floor/{clock}")
        print(
            f"| {group}/{function} | {clock or '—'} | {ns(med)} [{ns(low)}–{ns(high)}] "
            f"| {ratio(med, gov)} | {ratio(med, same)} | {ratio(med, floor)} |"
        )

    print()
    print("| algorithm (default clock) | admit_1t | reject_1t | reject ÷ admit | admit_2t | reject_2t | reject ÷ admit |")
    print("|---|---|---|---|---|---|---|")
    for name in ["turnstile/" + a for a in ALGORITHMS] + [GOV_DEFAULT]:
        cells = []
        for threads in ("1t", "2t"):
            admit = median(f"admit_{threads}", name)
            reject = median(f"reject_{threads}", name)
            cells += [
                "—" if admit is None else ns(admit),
                "—" if reject is None else ns(reject),
                "—" if admit is None or reject is None else f"{reject / admit:.2f}×",
            ]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
