"""Two builds' ``bench exchange`` runs side by side: is one slower?

    python -m benchmarks.exchange_compare --before RUN1,RUN4 --after RUN2,RUN3

Each RUN is the ``--out`` directory of one ``python -m benchmarks exchange``
run (its exchange.json), all with the same arguments, the two builds' runs
alternated (before, after, after, before, ...) on a quiet machine, each build
in its own checkout with its own op library. A process's times differ from
the next process's by more than a build's effect (up to 25% here), so one run
per side shows nothing; the comparison is over runs:

- per cell (gradient set, codec, mode): the median over each side's runs, and
  after / before;
- per run: the geometric mean over cells of its time over the cell's median
  across all runs, a run's level; after / before of the sides' mean levels,
  +- two standard errors of that difference. Slower means above 1 by more
  than that.
"""

import argparse
import math
import os
import statistics

MODES = ("layerwise", "one", "four")


def load_run(directory):
    from benchmarks.profile import read_json

    rows = read_json(os.path.join(directory, "exchange.json"), "exchange run")["rows"]
    return {(row["label"], row["algorithm"], mode): row["median_s"][mode]
            for row in rows for mode in MODES if mode in row["median_s"]}


def compare(before_runs, after_runs):
    """Per-cell medians and ratios, and the run levels, of two lists of runs
    (each ``load_run``'s dict). Cells missing from any run are left out."""
    if len(before_runs) < 2 or len(after_runs) < 2:
        raise ValueError("need at least two runs per side, got %d before and %d after"
                         % (len(before_runs), len(after_runs)))
    runs = before_runs + after_runs
    cells = [cell for cell in before_runs[0] if all(cell in run for run in runs)]
    if not cells:
        raise ValueError("the runs have no (gradient set, codec, mode) in common")
    rows = []
    for cell in cells:
        before = statistics.median(run[cell] for run in before_runs)
        after = statistics.median(run[cell] for run in after_runs)
        rows.append((cell, before, after, after / before))
    overall = {cell: statistics.median(run[cell] for run in runs) for cell in cells}

    def level(run):
        return math.exp(statistics.mean(math.log(run[c] / overall[c]) for c in cells))

    before_levels = [level(run) for run in before_runs]
    after_levels = [level(run) for run in after_runs]
    base = statistics.mean(before_levels)
    ratio = statistics.mean(after_levels) / base
    standard_error = math.sqrt(statistics.variance(before_levels) / len(before_levels)
                               + statistics.variance(after_levels) / len(after_levels)) / base
    return {"rows": rows, "before_levels": before_levels, "after_levels": after_levels,
            "ratio": ratio, "half_width": 2 * standard_error}


def report(result):
    from benchmarks.report import markdown_table

    rows = result["rows"]
    lines = [markdown_table(
        ["gradient set", "codec", "mode", "before ms", "after ms", "after/before"],
        [[label, codec, mode, "%.1f" % (1e3 * before), "%.1f" % (1e3 * after), "%.3f" % ratio]
         for (label, codec, mode), before, after, ratio in rows])]
    ratios = [row[3] for row in rows]
    geometric = math.exp(statistics.mean(math.log(r) for r in ratios))
    lines += [
        "",
        "cells: %d; after/before per cell: geometric mean %.3f, median %.3f, min %.3f, max %.3f"
        % (len(ratios), geometric, statistics.median(ratios), min(ratios), max(ratios)),
        "run levels: before %s; after %s"
        % (" ".join("%.3f" % v for v in result["before_levels"]),
           " ".join("%.3f" % v for v in result["after_levels"])),
        "after/before over runs: %.3f +- %.3f (two standard errors): %s"
        % (result["ratio"], result["half_width"], verdict(result)),
    ]
    return "\n".join(lines)


def verdict(result):
    if result["ratio"] - result["half_width"] > 1:
        return "after is slower"
    if result["ratio"] + result["half_width"] < 1:
        return "after is faster"
    return "no difference the runs resolve"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="comma-separated run directories")
    parser.add_argument("--after", required=True, help="comma-separated run directories")
    args = parser.parse_args(argv)
    before = [load_run(d) for d in args.before.split(",") if d]
    after = [load_run(d) for d in args.after.split(",") if d]
    print(report(compare(before, after)))


if __name__ == "__main__":
    main()
