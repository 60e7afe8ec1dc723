"""What the partition search tells its user, on rank 0 only: log lines (``verbose=1``),
TensorBoard scalars of the candidates (``log_dir``) and a PNG of the search (matplotlib;
docs/search.md, "Saved results and pictures").
"""

import logging
import os

import numpy as np

from tf_mergecomp import communication, grouping
from tf_mergecomp.search.requests import PLAIN_HOROVOD
from tf_mergecomp.search.summary import codecs_text, short

PLOT_NAME = "mergecomp_search.png"
STEPS_ASIDE = "plain Horovod is fastest here: MergeComp steps aside"


class SearchNoise(logging.Filter):
    """Keeps out of TensorFlow's log, while a search runs (``install``, ``remove``), the
    warnings the search causes on purpose: tf.function retracing (one trace per candidate)
    and Keras' slow ``on_train_batch_end`` (profiled steps wait for every gradient). The
    search's own summary says what they cost."""

    MESSAGES = ("triggered tf.function retracing", "is slow compared to the batch time")

    def filter(self, record):
        message = record.getMessage()
        return not any(text in message for text in self.MESSAGES)

    def install(self):
        logging.getLogger("tensorflow").addFilter(self)

    def remove(self):
        logging.getLogger("tensorflow").removeFilter(self)


class SearchReport:
    """Log lines, TensorBoard scalars and the PNG of one search, on rank 0."""

    def __init__(self, verbose, log_dir):
        self.verbose = int(verbose)
        self.log_dir = log_dir
        self.rounds_logged = 0
        self._writer = None

    def log(self, message):
        if self.verbose and communication.rank() == 0:
            print("MergeComp search: " + message, flush=True)

    def finalists(self, algorithm, n, rounds):
        self.log("predicted %s; confirming %s against one group and layer-wise in %d "
                 "interleaved rounds, after an untimed turn of each" % (
                     ", ".join("%s %.2f ms" % (short(l, n, algorithm.codecs_of(l),
                                                     algorithm.fusion_layout),
                                               1e3 * algorithm.predictions[l])
                               for l in [()] + algorithm.finalist_layouts
                               if l in algorithm.predictions),
                     ", ".join(short(l, n, algorithm.codecs_of(l), algorithm.fusion_layout)
                               for l in algorithm.finalist_layouts) or "nothing else",
                     rounds))
        if algorithm.plain_horovod:
            self.log("plain Horovod (no compression, Horovod's own fusion) is confirmed too")

    def rounds(self, algorithm, n, planned_rounds, final=False):
        """One line per finished confirm round (a round is over once the next began)."""
        measured_rounds = algorithm.rounds_measured
        finished = len(measured_rounds) if final else len(measured_rounds) - 1
        while self.rounds_logged < finished:
            measured = measured_rounds[self.rounds_logged]
            self.rounds_logged += 1
            if self.rounds_logged <= planned_rounds:
                title = "round %d of %d" % (self.rounds_logged, planned_rounds)
            else:
                title = "round %d (extra, the leader's gain over one group unresolved)" % (
                    self.rounds_logged)
            self.log("%s: %s" % (title, ", ".join(
                "%s %.2f ms%s" % (short(layout, n, algorithm.codecs_of(layout),
                                        algorithm.fusion_layout), 1e3 * seconds,
                                  " (predicted %.2f)" % (1e3 * algorithm.predictions[layout])
                                  if layout in algorithm.predictions else "")
                for layout, seconds in measured.items())))

    def choice(self, algorithm, choice, n, cost):
        measured = algorithm.measured_seconds()
        sentinels = []
        if () in measured:
            sentinels.append("one group %.2f ms" % (1e3 * measured[()]))
        layerwise = grouping.layerwise_splits(n)
        if n > 1 and layerwise in measured:
            sentinels.append("layer-wise %.2f ms" % (1e3 * measured[layerwise]))
        if PLAIN_HOROVOD in measured:
            sentinels.append("plain Horovod %.2f ms" % (1e3 * measured[PLAIN_HOROVOD]))
        relative = algorithm.relative_seconds()
        if layerwise in relative and n > 1:
            sentinels.append("layer-wise/one group %.3f" % relative[layerwise])
        self.log("chose %s: %.2f ms/step, %.3fx one group's step in the same rounds (%s; "
                 "medians of %d interleaved rounds); the search spent %d traces of the train "
                 "step, %d steps, %.1f s" % (
                     describe(choice, algorithm.codecs_of(choice)),
                     1e3 * measured.get(choice, float("nan")),
                     relative.get(choice, float("nan")),
                     ", ".join(sentinels), len(algorithm.rounds_measured),
                     cost["traces"], cost["steps"], cost["seconds"]))
        if choice == PLAIN_HOROVOD:
            self.log(STEPS_ASIDE)
        for note in algorithm.notes:
            self.log(note)

    def tensorboard(self, algorithm, history, choice):
        if self.log_dir is None or communication.rank() != 0:
            return
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        measured = algorithm.measured_seconds()
        with self._writer.as_default():
            for record in history:
                layout = (PLAIN_HOROVOD if record.get("plain_horovod")
                          else tuple(record["splits"]))
                step = record["candidate"]
                tf.summary.scalar("mergecomp_search/candidate_seconds", measured[layout], step=step)
                if record["groups"] is not None:
                    tf.summary.scalar("mergecomp_search/candidate_groups", record["groups"],
                                      step=step)
                if record["predicted_s"] is not None:
                    tf.summary.scalar("mergecomp_search/candidate_predicted_seconds",
                                      record["predicted_s"], step=step)
            if choice in measured:
                tf.summary.scalar("mergecomp_search/chosen_seconds", measured[choice], step=0)
        self._writer.flush()

    def plot(self, algorithm, choice, save_path):
        """Draws the search beside ``save_path`` (or in ``log_dir``); the PNG's path, or None."""
        if communication.rank() != 0 or (save_path is None and self.log_dir is None):
            return None
        if save_path is not None:
            path = os.path.splitext(save_path)[0] + ".png"
        else:
            path = os.path.join(self.log_dir, PLOT_NAME)
        try:
            plot_search(algorithm, choice, path)
        except ImportError as error:
            self.log("no picture of the search: %s" % error)
            return None
        self.log("drew the search in %s" % path)
        return path


def describe(splits, codecs=None):
    """A layout's group count, its first splits and its groups' codecs."""
    if isinstance(splits, str):
        return "%s (MergeComp steps aside)" % splits
    splits = tuple(splits)
    if not splits:
        return "1 group" + codecs_text(codecs)
    shown = ", ".join(str(s) for s in splits[:8]) + (", ..." if len(splits) > 8 else "")
    return "%d groups, splits (%s)%s" % (len(splits) + 1, shown, codecs_text(codecs))


def plot_search(algorithm, choice, path):
    """One panel per group count (2 to ``max_groups``): each candidate's time (y) over its
    cuts (x), predicted in grey, confirmed in colour with its rounds' spread and its groups'
    codecs; the sentinels as horizontal lines, the choice as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = list(range(2, max(algorithm.max_groups, 2) + 1))
    fig, axes = plt.subplots(1, len(counts), figsize=(5.2 * len(counts), 4.2), squeeze=False,
                             sharey=True)
    measured = algorithm.measured_seconds()
    n = algorithm.num_tensors
    if choice is not None and not isinstance(choice, str):
        choice = tuple(choice)
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
            if isinstance(layout, str) or len(layout) + 1 != groups or layout not in measured:
                continue
            rounds = 1e3 * np.asarray(algorithm.rounds_of(layout))
            line = ax.plot(layout, [1e3 * measured[layout]] * len(layout), marker="o",
                           linewidth=2, label="confirmed %s" % (
                               short(layout, n, algorithm.codecs_of(layout)),))[0]
            codecs = algorithm.codecs_of(layout)
            if codecs is not None:
                bounds = (0,) + tuple(layout) + (n,)
                for lo, hi, name in zip(bounds[:-1], bounds[1:], codecs):
                    ax.annotate(name, ((lo + hi) / 2, 1e3 * measured[layout]), fontsize=7,
                                ha="center", va="bottom", color=line.get_color())
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
    if choice is None:
        chosen = "-"
    elif isinstance(choice, str):
        chosen = choice
    else:
        chosen = ("1 group" if not choice else "%d groups %s" % (
            len(choice) + 1, list(choice) if len(choice) <= 6 else "(layer-wise)"
            if len(choice) == n - 1 else "(%d cuts)" % len(choice)))
        if algorithm.codecs_of(choice) is not None:
            chosen += ", codecs %s" % (list(algorithm.codecs_of(choice)),)
    fig.suptitle("MergeComp partition search: %d tensors, chose %s" % (n, chosen), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _sentinel_lines(ax, algorithm, measured, choice, n):
    layerwise = tuple(range(1, n))
    for layout, label, style in (((), "one group", "--"), (layerwise, "layer-wise", ":"),
                                 (PLAIN_HOROVOD, "plain Horovod", "-.")):
        if layout not in measured:
            continue
        ax.axhline(1e3 * measured[layout], color="black", linestyle=style,
                   label="%s (measured)%s" % (label, ", chosen" if layout == choice else ""))
