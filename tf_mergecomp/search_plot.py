"""A picture of one partition search (matplotlib, written by rank 0).

One panel per group count (2 to ``max_groups``): each candidate is drawn at
its time (y) over the positions of its cuts (x, tensor index in backprop
order), joined by a line; the model's predictions in grey (for 2 groups, the
predicted time of every split as a curve), the confirmed candidates in colour
at their measured median with the spread of their rounds, the sentinels (one
group, layer-wise) as horizontal lines at their measured medians, and the
chosen partition as a star.
"""

import numpy as np


def plot_search(algorithm, choice, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = list(range(2, max(algorithm.max_groups, 2) + 1))
    fig, axes = plt.subplots(1, len(counts), figsize=(5.2 * len(counts), 4.2), squeeze=False,
                             sharey=True)
    measured = algorithm.measured_seconds()
    n = algorithm.num_tensors
    choice = tuple(choice) if choice is not None else None
    for ax, groups in zip(axes[0], counts):
        if groups == 2 and algorithm.model is not None and n > 1:
            splits = np.arange(1, n).reshape(-1, 1)
            ax.plot(splits[:, 0], 1e3 * algorithm.model.step_times(splits), color="0.75",
                    linewidth=1, label="predicted, every split")
        predicted = [(l, s) for l, s in algorithm.predictions.items() if len(l) + 1 == groups]
        for index, (layout, seconds) in enumerate(sorted(predicted, key=lambda x: x[1])):
            ax.plot(layout, [1e3 * seconds] * len(layout), color="0.55", marker=".",
                    linewidth=0.6, label="predicted" if index == 0 else None)
        for layout in algorithm.candidates:
            if len(layout) + 1 != groups or layout not in measured:
                continue
            rounds = 1e3 * np.asarray(algorithm.rounds_of(layout))
            line = ax.plot(layout, [1e3 * measured[layout]] * len(layout), marker="o",
                           linewidth=2, label="confirmed %s" % (list(layout),))[0]
            ax.vlines(layout, rounds.min(), rounds.max(), color=line.get_color(), linewidth=1)
            if layout == choice:
                ax.plot(layout, [1e3 * measured[layout]] * len(layout), marker="*",
                        markersize=16, color="gold", markeredgecolor="black", linestyle="none",
                        label="chosen")
        _sentinel_lines(ax, algorithm, measured, choice, n)
        ax.set_xlim(0, n)
        ax.set_xlabel("cut position (tensor index, backprop order)")
        ax.set_ylabel("ms per step")
        ax.set_title("%d groups" % groups, fontsize=10)
        ax.legend(fontsize=7, loc="best")
    chosen = "-" if choice is None else ("1 group" if not choice else "%d groups %s" % (
        len(choice) + 1, list(choice) if len(choice) <= 6 else "(layer-wise)"
        if len(choice) == n - 1 else "(%d cuts)" % len(choice)))
    fig.suptitle("MergeComp partition search: %d tensors, chose %s" % (n, chosen), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _sentinel_lines(ax, algorithm, measured, choice, n):
    layerwise = tuple(range(1, n))
    for layout, label, style in (((), "one group", "--"), (layerwise, "layer-wise", ":")):
        if layout not in measured:
            continue
        ax.axhline(1e3 * measured[layout], color="black", linestyle=style,
                   label="%s (measured)%s" % (label, ", chosen" if layout == choice else ""))
