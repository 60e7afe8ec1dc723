"""The driver's answers to the profile and probe requests: what recorder.py measures of the
training, combined over the ranks."""

import time

import numpy as np

from tf_mergecomp.search import recorder
from tf_mergecomp.search import requests as search_requests
from tf_mergecomp.search.settings import steps_per_turn


def profile(driver):
    """The profile request, step by step (a generator the driver's plan yields from): discarded
    steps, profiled steps, as many plain timed ones; returns the ``ProfileResult``."""
    for _ in range(driver.warmup_steps):
        yield "discard"
    driver._profiler = recorder.StepProfiler()
    if not driver._profiler.start():
        driver.profile_note = driver._profiler.error
    for _ in range(driver.profiled_steps):
        yield "profiled"
    profiled = driver._profiler.stop(driver._producers.producers)
    driver._profiler = None
    # The profiler slows every op down: the same number of steps without
    # it give the step's real time, and the ready times are scaled to it.
    plain = []
    for _ in range(driver.profiled_steps):
        plain.append((yield "timed"))
    n = driver.compression.num_tensors
    plain = float(np.median(plain))
    if profiled:
        ready = np.nanmedian(np.stack([p.ready for p in profiled]), axis=0) \
            if any(np.isfinite(p.ready).any() for p in profiled) else np.full(n, np.nan)
        under_profiler = float(np.median([p.seconds for p in profiled]))
        unseen = int(np.isnan(ready).sum())
        if unseen:
            driver.profile_note = "%d of %d gradients not seen in the profile" % (unseen, n)
    else:
        ready, under_profiler = np.full(n, np.nan), plain
        driver.profile_note = driver.profile_note or "no profile"
    ready = driver._values.mean_of_finite(ready, "ready")
    under_profiler = float(driver._values.average(under_profiler, "seconds"))
    plain = float(driver._values.average(plain, "seconds"))
    driver.turn_steps = steps_per_turn(plain, driver.steps_per_candidate, driver.min_turn_seconds)
    ready = ready * (plain / under_profiler if under_profiler > 0 else 1.0)
    seen = ready[np.isfinite(ready)]
    driver.report.log("profiled one group over %d steps (%.1f ms/step, %.1f under the profiler): "
              "gradients ready from %s to %s ms%s" % (
                  driver.profiled_steps, 1e3 * plain, 1e3 * under_profiler,
                  "%.1f" % (1e3 * seen.min()) if seen.size else "?",
                  "%.1f" % (1e3 * seen.max()) if seen.size else "?",
                  " (%s)" % driver.profile_note if driver.profile_note else ""))
    if driver.turn_steps != driver.steps_per_candidate:
        driver.report.log("confirm turns of %d timed steps (at least %.2f s each)" % (
            driver.turn_steps, driver.min_turn_seconds))
    return search_requests.ProfileResult(plain, ready)


def probe_layouts(driver, layouts, codec=None):
    """The probe request: every group of ``layouts`` timed alone, combined over the ranks."""
    started = time.perf_counter()
    if driver._probe is None:
        driver._probe = recorder.ExchangeProbe(driver.compression)
    answers = []
    for layout in layouts:
        samples = driver._probe.run(layout, repeats=driver.probe_repeats, codec=codec)
        answers.append(combine_probe(driver._values, samples))
    driver.report.log("probed %d groups of %d layouts alone%s in %.1f s" % (
        sum(len(a) for a in answers), len(layouts),
        "" if codec is None else " with %s" % codec, time.perf_counter() - started))
    return answers


def combine_probe(values, samples):
    """[groups, 3] from every rank's [repeats, groups, 3]: encode and decode
    averaged over the ranks, the collective the least over the ranks (the
    last rank to arrive waits for no one: its time is the transfer's), then
    the median over the repeats."""
    encode_decode = values.average(samples, "probe_codec")
    collective = values.minimum(samples[:, :, 1], "probe_collective")
    combined = np.array(encode_decode)
    combined[:, :, 1] = collective
    return np.median(combined, axis=0)
