#!/usr/bin/env python3
"""Markdown tables from the last `cargo bench --bench try_acquire` (or `--bench waiting`) run.

    python3 benches/summarize.py [CRITERION_DIR]             # try_acquire
    python3 benches/summarize.py --waiting [CRITERION_DIR]   # waiting (issue 3)

CRITERION_DIR defaults to $CARGO_TARGET_DIR/criterion, else target/criterion next to this crate.
Reads every <group>/<function>/new/{benchmark,estimates}.json and prints, per benchmark, the median
(criterion's point estimate and its 95% confidence interval) and three ratios:

- x gov default: to `governor/default_clock` in the same group (governor's default QuantaClock);
- x gov same clock: to governor on the same kind of clock (upkeep: quanta's 1 ms upkeep clock;
  monotonic: std Instant; quanta: QuantaClock);
- x floor: to `floor/<clock>` (load + clock read + uncontended CAS) for single-thread rows and for
  reject_2t (rejections write nothing, so there is no contention); for admit_2t, to
  `admit_2t/floor/<clock>`, the same floor with both threads on one word, measured in the same run.

Then a reject-vs-admit table per algorithm.

With --waiting: the `waiting` group's medians and the ratios issue 3 sets targets for, computed
from those medians; the same ratios measured by alternating both sides in short batches
(waiting-paired/paired.json, the figures the verdicts should rest on: see benches/waiting.rs); and
the load test's table (waiting-load/load.json).

Only the standard library is used.
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
WAITING = "waiting"
# (what, numerator, denominator, target ratio or None): ids are functions of the `waiting` group.
WAITING_RATIOS = [
    ("ConcurrencyLimiter try_acquire + drop ÷ tokio Semaphore",
     "try_acquire_drop/turnstile", "try_acquire_drop/tokio_semaphore", 0.7),
    ("ConcurrencyLimiter try_acquire_owned + drop ÷ tokio Semaphore (owned)",
     "try_acquire_owned_drop/turnstile", "try_acquire_owned_drop/tokio_semaphore", None),
    ("ConcurrencyLimiter acquire().await (no-op poll) + drop ÷ its try_acquire + drop",
     "acquire_poll_drop/turnstile", "try_acquire_drop/turnstile", 1.2),
    ("RateLimiter token bucket acquire().await (no-op poll) ÷ its try_acquire",
     "rate_acquire_poll/token_bucket", "rate_try_acquire/token_bucket", 1.2),
    ("RateLimiter fixed window acquire().await (no-op poll) ÷ its try_acquire",
     "rate_acquire_poll/fixed_window", "rate_try_acquire/fixed_window", 1.2),
    ("same harness: ConcurrencyLimiter acquire().await ÷ try_acquire, both in a no-op-polled future",
     "acquire_poll_drop/turnstile", "try_acquire_in_poll_drop/turnstile", None),
    ("same harness: token bucket acquire().await ÷ try_acquire, both in a no-op-polled future",
     "rate_acquire_poll/token_bucket", "rate_try_acquire_in_poll/token_bucket", None),
    ("same harness: fixed window acquire().await ÷ try_acquire, both in a no-op-polled future",
     "rate_acquire_poll/fixed_window", "rate_try_acquire_in_poll/fixed_window", None),
    ("ConcurrencyLimiter acquire().await (no-op poll) + drop ÷ tokio Semaphore acquire (no-op poll)",
     "acquire_poll_drop/turnstile", "acquire_poll_drop/tokio_semaphore", None),
    ("block_on: ConcurrencyLimiter acquire().await + drop ÷ try_acquire + drop",
     "block_on/acquire_drop/turnstile", "block_on/try_acquire_drop/turnstile", 1.2),
    ("block_on: RateLimiter token bucket acquire().await ÷ try_acquire",
     "block_on/rate_acquire/token_bucket", "block_on/rate_try_acquire/token_bucket", 1.2),
]


def criterion_dir(args) -> Path:
    if args:
        return Path(args[0])
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


def waiting(root: Path, results: dict) -> None:
    rows = {f: r for (g, f), r in results.items() if g == WAITING}
    if not rows:
        sys.exit(f"no `{WAITING}` results under {root}: run `cargo bench --bench waiting`")
    print(f"<!-- from {root} -->")
    print("| benchmark | median ns [95% CI] |")
    print("|---|---|")
    for function, (med, low, high) in sorted(rows.items()):
        print(f"| {WAITING}/{function} | {ns(med)} [{ns(low)}–{ns(high)}] |")

    print()
    print("Ratios of criterion medians (the two sides measured one after the other):")
    print()
    print("| ratio | numerator ns | denominator ns | ratio | target | verdict |")
    print("|---|---|---|---|---|---|")
    for what, num, den, target in WAITING_RATIOS:
        if num not in rows or den not in rows:
            continue
        r = rows[num][0] / rows[den][0]
        if target is None:
            goal, verdict = "—", "—"
        else:
            goal = f"≤ {target:.1f}×"
            verdict = "met" if r <= target else f"**missed by {(r / target - 1) * 100:.0f} %**"
        print(f"| {what} | {ns(rows[num][0])} | {ns(rows[den][0])} | {r:.2f}× | {goal} | {verdict} |")

    paired_json = root / "waiting-paired" / "paired.json"
    if paired_json.exists():
        data = json.loads(paired_json.read_text())
        print()
        print(
            f"Paired ratios (both sides alternated in batches of {data['batch']} calls, "
            f"{data['seconds_per_pair']:g} s per pair; median of per-round ratios [95% CI]):"
        )
        print()
        print("| ratio | numerator ns | denominator ns | rounds | ratio [95% CI] | target | verdict |")
        print("|---|---|---|---|---|---|---|")
        for p in data["results"]:
            target, r = p["target"], p["ratio"]
            if target is None:
                goal, verdict = "—", "—"
            else:
                goal = f"≤ {target:.1f}×"
                verdict = "met" if r <= target else f"**missed by {(r / target - 1) * 100:.0f} %**"
            print(
                f"| {p['what']} | {ns(p['numerator_ns'])} | {ns(p['denominator_ns'])} "
                f"| {p['rounds']} | {r:.2f}× [{p['ratio_low']:.2f}–{p['ratio_high']:.2f}] "
                f"| {goal} | {verdict} |"
            )

    load_json = root / "waiting-load" / "load.json"
    if not load_json.exists():
        print(f"\n(no load test results at {load_json})")
        return
    data = json.loads(load_json.read_text())
    print()
    print(
        f"Load: {data['tasks']} tasks, tokio multi-thread ({data['worker_threads']} workers), "
        f"token bucket {data['rate_per_s']}/s, {data['duration_s']:g} s per scenario; lateness in µs."
    )
    print()
    print("| limiter | clock | burst | admissions | admitted/s | error vs 1000/s "
          "| lateness p50 | p99 | max | own view p50 / p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in data["results"]:
        late, own = r["lateness_us"], r["own_view_lateness_us"]
        own_cell = "—" if own is None else f"{own['p50']:.0f} / {own['p99']:.0f}"
        print(
            f"| {r['limiter']} | {r['clock']} | {r['burst']} | {r['admissions']} "
            f"| {r['admitted_per_s']:.1f} | {r['error_pct']:+.1f} % | {late['p50']:.0f} "
            f"| {late['p99']:.0f} | {late['max']:.0f} | {own_cell} |"
        )


def main() -> None:
    args = sys.argv[1:]
    show_waiting = "--waiting" in args
    args = [a for a in args if a != "--waiting"]
    root = criterion_dir(args)
    results = load(root)
    if not results:
        sys.exit(f"no criterion results under {root}")
    if show_waiting:
        waiting(root, results)
        return
    # Only the try_acquire bench's groups: the waiting benchmarks have their own tables
    # (--waiting), and the keyed benches write theirs to the same directory.
    results = {k: v for k, v in results.items() if k[0] in GROUP_ORDER}

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
