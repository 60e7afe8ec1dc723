"""A profile of the MergeComp paper's setting, built from published figures, not measured.

    python -m benchmarks.paper_profile [--out docs/profiles/resnet50_2xv100_paper.json]

The paper's (arXiv 2103.15195) small testbed: 2 V100 GPUs over PCIe 3.0 or
NVLink, ResNet50 at 224x224, batch 32 per GPU. No GPU is at hand here, so
every number is derived from a published figure, each cited in the JSON's
``notes``; ``source`` says so. What is built and how:

- tensors: the shapes of Keras' ``ResNet50(weights=None, input_shape=(224,
  224, 3), classes=1000)`` trainable variables, in backprop order (reversed);
- compute: one step of ``STEP_S`` (the published V100 FP32 training
  throughput, see NOTES), one third forward and two thirds backward (a
  backward pass computes the data and the weight gradients: twice the
  forward's multiply-adds); backprop's time is shared among the layers in
  proportion to each layer's modelled time (its multiply-adds at the V100's
  FP32 peak times an efficiency, plus its activations' bytes at HBM2
  bandwidth for the memory-bound layers), and a layer's gradients are ready
  when its share is done; the optimizer update is SGD with momentum, three
  passes over the weights at HBM2 bandwidth plus one kernel per tensor;
- codecs: each encode and decode costs its kernels (``KERNELS``: the ops of
  a straightforward framework implementation, as GRACE's) times the
  per-kernel launch cost, plus its passes over the group's float32 buffer at
  HBM2 bandwidth; a merged group pays one flatten copy per tensor; codec
  kernels run on the stream that runs backprop (TensorFlow issues a GPU's
  kernels on one compute stream), so they delay it, while decodes need not
  wait for its end (several inter-op threads);
- networks: ``pcie3`` and ``nvlink``, their per-direction bandwidth (80% of
  the link's theoretical rate) and NCCL's per-ring-step latency.
"""

import argparse
import json
import os
import sys

SOURCE = ("published figures (not measured): 2 x V100 over PCIe 3.0 or NVLink 2.0, ResNet50 "
          "224x224, batch 32; see notes")
STEP_S = 32 / 320.0  # 320 images/s FP32 at batch 32 per V100 (NOTES[0])
FORWARD_FRACTION = 1.0 / 3.0
V100_FP32_FLOPS = 15.7e12
CONV_EFFICIENCY = 0.5  # fraction of FP32 peak a cuDNN convolution reaches (NOTES[0])
HBM2_BYTES_PER_S = 900e9
V100_SMS = 80
# Top-k's selection as the frameworks of the paper's time ran it on one slice
# (NOTES[7]): a radix select over 2-bit digits (16 passes for float32) and a
# gather pass, all in one thread block, i.e. on one of the V100's SMs, whose
# share of HBM2 bandwidth bounds it.
TOPK_SELECT_PASSES = 32 // 2 + 1
TOPK_SELECT_BYTES_PER_S = HBM2_BYTES_PER_S / V100_SMS
LAUNCH_S = 10e-6  # one framework op on the GPU: launch and dispatch (NOTES[2])
NCCL_STEP_LATENCY_S = 5e-6  # per ring step, intra-node (NOTES[4])
LINK_EFFICIENCY = 0.8
PCIE3_BYTES_PER_S = 15.75e9 * LINK_EFFICIENCY
NVLINK2_BYTES_PER_S = 25e9 * LINK_EFFICIENCY

# (encode kernels, encode passes over the float32 group, decode kernels, decode
# passes per received row). Passes count reads and writes of group-sized
# float32 buffers (the error-feedback residual's read and write included).
KERNELS = {
    "none": (1, 2, 1, 2),
    "fp16": (1, 1.5, 1, 1.5),
    "qsgd": (8, 6, 4, 2),
    "terngrad": (7, 5, 4, 2),
    "onebit": (8, 6, 4, 1.5),
    "signsgd": (3, 1.5, 3, 1.5),
    "signum": (5, 4, 3, 1.5),
    "efsignsgd": (7, 6, 4, 1.5),
    "topk": (6, 8, 3, 0.1),
    "dgc": (10, 7, 3, 0.1),
    "randomk": (5, 4, 3, 0.1),
    "powersgd": (12, 8, 6, 2),
}
NOTES = [
    "[0] Compute: NVIDIA's V100 whitepaper gives 15.7 TFLOPS FP32 and 900 GB/s HBM2 "
    "(https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf). "
    "ResNet50 training at 224x224 needs about 3 x 4.1 G multiply-adds per image; published V100 "
    "FP32 training throughputs of ResNet50 in TensorFlow are in the 300-400 images/s range at "
    "batch 64-256 (NVIDIA DeepLearningExamples performance tables); 320 images/s is taken for "
    "batch 32 (step %.1f ms), i.e. about 50%% of FP32 peak." % (1e3 * STEP_S),
    "[1] TensorRT's published ResNet50 FP32 inference on V100 at batch 32, 1383 images/s "
    "(https://gist.github.com/1duo/efd3be1dc8eb2c45863b75f20a76f8b2), bounds the forward pass "
    "below (23 ms); the forward third of the step used here is 33 ms.",
    "[2] Kernel launch: about 4-5 us per CUDA launch (Volkov's measurement, "
    "https://forums.developer.nvidia.com/t/cost-of-launching-a-kernel-function/18347/17), about "
    "20 us for a framework element-wise op's whole round trip on a V100 (NVIDIA Nsight Systems "
    "guide, quoted at https://groundy.com/articles/every-cuda-kernel-pays-a-launch-tax-the-host-"
    "to-device-walkthrough/); 10 us per op is taken.",
    "[3] PCIe 3.0 x16: 8 GT/s x 16 lanes with 128b/130b coding, 15.75 GB/s per direction "
    "(PCI-SIG); NVLink 2.0: 25 GB/s per direction per link (V100 whitepaper); 80% of each is "
    "taken as what NCCL's ring reaches.",
    "[4] NCCL latency: an 8-byte allreduce over 8 PCIe GPUs (14 ring steps) takes about 42 us in "
    "nccl-tests (https://github.com/NVIDIA/nccl/issues/1530), about 3 us per step; 5 us per ring "
    "step is taken for both links.",
    "[5] Horovod: 64 MB fusion buffer and 1 ms cycle time, Horovod's defaults "
    "(HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME).",
    "[6] Codec kernels and passes (KERNELS in benchmarks/paper_profile.py) are counts "
    "for a straightforward framework implementation of each codec (GRACE-style), not measured.",
    "[7] Top-k selection: PyTorch's CUDA top-k of the paper's time selected the k-th value of a "
    "slice by radix select over 2-bit digits (RADIX_BITS 2 in its SortingRadixSelect.cuh: 16 "
    "passes for float32) and gathered the results, with one thread block per slice; the "
    "multi-block version came in 2022 (https://github.com/pytorch/pytorch/pull/74267, "
    "'Parallelize gatherTopK on multiple blocks'). A top-k over one tensor or one merged group "
    "(one slice) therefore runs on one of the V100's 80 SMs: modelled as %d passes over the "
    "float32 buffer at 1/80 of HBM2 bandwidth (%.1f ns per element), in the encode of topk "
    "only (DGC selects on a sample)." % (TOPK_SELECT_PASSES,
                                        1e9 * 4 * TOPK_SELECT_PASSES / TOPK_SELECT_BYTES_PER_S),
]


def layer_costs(model):
    """[(layer variables, modelled seconds)] in forward order, for layers with
    trainable variables: multiply-adds at CONV_EFFICIENCY of peak, plus
    activation bytes (read and written twice) at HBM2 bandwidth."""
    costs = []
    for layer in model.layers:
        variables = layer.trainable_variables
        if not variables:
            continue
        output = layer.output_shape
        if isinstance(output, list):
            output = output[0]
        activations = 1
        for dimension in output[1:]:
            activations *= int(dimension)
        kernel = variables[0].shape.as_list()
        macs = 0
        if len(kernel) == 4:  # conv: kh * kw * cin * cout per output position
            macs = activations * kernel[0] * kernel[1] * kernel[2]
        elif len(kernel) == 2:  # dense
            macs = kernel[0] * kernel[1]
        seconds = 2 * macs / (V100_FP32_FLOPS * CONV_EFFICIENCY) \
            + 4 * 4 * activations / HBM2_BYTES_PER_S
        costs.append((variables, seconds))
    return costs


def build(batch_size=32):
    import numpy as np

    from tf_mergecomp.keras2 import keras
    from benchmarks.network_model import HOROVOD_CYCLE_S, HOROVOD_FUSION_BYTES

    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    costs = layer_costs(model)
    forward_s = STEP_S * FORWARD_FRACTION
    optimizer_s = 3 * 4 * model.count_params() / HBM2_BYTES_PER_S \
        + len(model.trainable_variables) * LAUNCH_S
    backward_s = STEP_S - forward_s - optimizer_s
    total = sum(seconds for _, seconds in costs)
    shapes, ready = [], []
    elapsed = forward_s
    for variables, seconds in reversed(costs):  # backprop order
        elapsed += backward_s * seconds / total
        for variable in reversed(variables):
            shapes.append(variable.shape.as_list())
            ready.append(elapsed)
    sizes = [int(np.prod(s)) for s in shapes]
    if len(sizes) != len(model.trainable_variables):
        raise RuntimeError("not every trainable variable was placed")

    from tf_mergecomp import compressors
    from benchmarks.profile import SCHEMA, wire_model

    codecs = {}
    for name, (encode_kernels, encode_passes, decode_kernels, decode_passes) in KERNELS.items():
        compressor = compressors.get(name)
        per_element = 4.0 / HBM2_BYTES_PER_S
        encode_per_element = encode_passes * per_element
        if name == "topk":
            encode_per_element += TOPK_SELECT_PASSES * 4.0 / TOPK_SELECT_BYTES_PER_S
        codecs[name] = {
            "collective_op": compressor.collective,
            "collectives_per_group": 2 if name == "powersgd" else 1,
            "wire": wire_model(compressor, shapes),
            # A merged group flattens its tensors: one copy kernel per tensor.
            "encode": {"fixed_s": encode_kernels * LAUNCH_S,
                       "per_element_s": encode_per_element,
                       "per_tensor_s": LAUNCH_S},
            "collective": {"fixed_s": 0.0, "per_element_s": 0.0, "per_tensor_s": 0.0},
            "decode": {"fixed_s": decode_kernels * LAUNCH_S,
                       "per_element_s": decode_passes * per_element,
                       "per_tensor_s": LAUNCH_S},
        }
    return {
        "schema": SCHEMA,
        "source": SOURCE,
        "model": "resnet50",
        "tensors": {"shapes": shapes, "sizes": sizes, "dtypes": ["float32"] * len(sizes),
                    "order": "backprop", "input": [224, 224, 3], "classes": 1000},
        "compute": {"batch_size": batch_size, "forward_s": forward_s, "backward_s": backward_s,
                    "optimizer_s": optimizer_s, "step_s": STEP_S, "tail_s": optimizer_s,
                    "ready_s": ready},
        "codecs": codecs,
        "placement": {"codec_on_compute": True, "decodes_after_backprop": False},
        "horovod": {"cycle_time_s": HOROVOD_CYCLE_S, "fusion_buffer_bytes": HOROVOD_FUSION_BYTES,
                    "fp32": "none", "fp16": "fp16", "probe_waits_cycle": False,
                    # Horovod copies into its fusion buffer on a CUDA stream of its own.
                    "fusion_copies_on_compute": False},
        "networks": {
            "pcie3": {"bandwidth_bytes_per_s": PCIE3_BYTES_PER_S,
                      "latency_s": NCCL_STEP_LATENCY_S, "note": "notes [3], [4]"},
            "nvlink": {"bandwidth_bytes_per_s": NVLINK2_BYTES_PER_S,
                       "latency_s": NCCL_STEP_LATENCY_S, "note": "notes [3], [4]"},
        },
        "constants": {"launch_s": LAUNCH_S, "hbm2_bytes_per_s": HBM2_BYTES_PER_S,
                      "v100_fp32_flops": V100_FP32_FLOPS, "conv_efficiency": CONV_EFFICIENCY,
                      "v100_sms": V100_SMS, "topk_select_passes": TOPK_SELECT_PASSES,
                      "link_efficiency": LINK_EFFICIENCY, "kernels": KERNELS},
        "notes": NOTES,
    }


def _layout_words(layout, group_codecs):
    if isinstance(layout, str):
        return layout
    words = "%d groups" % (len(layout) + 1)
    if group_codecs:
        words += " (%d plain)" % sum(1 for c in group_codecs if c == "none")
    return words


def comparison_table(result):
    from benchmarks import report

    rows = [[r["codec"], "%d -> %d" % (r["paper_layerwise"], r["paper_mergecomp"]),
             "%+d" % r["paper_gain"],
             "%.0f -> %.0f" % (r["sim_layerwise"], r["sim_mergecomp"]), "%+.0f" % r["sim_gain"],
             str(r["sim_groups"]), "%+.0f" % r["gap_layerwise"], "%+.0f" % r["gap_mergecomp"],
             "-" if r.get("sim_per_group") is None else "%.0f (%s)" % (
                 r["sim_per_group"], r["sim_per_group_layout"])]
            for r in sorted(result["rows"], key=lambda r: -r["paper_gain"])]
    rho = {column: "-" if result[column + "_rank_correlation"] is None
           else "%.2f" % result[column + "_rank_correlation"]
           for column in ("gain", "layerwise", "mergecomp")}
    return "%s\n\nHorovod fp32: paper %d%%, simulated %.0f%%. Rank correlation with the " \
           "paper (Spearman): gains %s, layer-wise %s, MergeComp %s." % (
               report.markdown_table(["codec", "paper %", "paper gain", "simulated %",
                                      "simulated gain", "searched groups",
                                      "gap layer-wise (points)", "gap MergeComp (points)",
                                      "simulated % per-group codecs"], rows),
               PAPER_PCIE_FP32, result["fp32"], rho["gain"], rho["layerwise"], rho["mergecomp"])


def compare_all(profile):
    """The comparison on PCIe, on NVLink, and on the link rate that gives the paper's
    fp32 scaling (48%) -- one number fitted, stated as such -- with the exchange
    overlapping backprop and, as a hypothesis (``SerializedExchange``), not."""
    networks = profile["networks"]
    latency = networks["pcie3"]["latency_s"]
    result = {
        "pcie3": compare_with_paper(profile, networks["pcie3"]["bandwidth_bytes_per_s"], latency),
        "nvlink": compare_with_paper(profile, networks["nvlink"]["bandwidth_bytes_per_s"],
                                     latency, PAPER_NVLINK),
    }
    for name, overlap in (("fp32_fitted", True), ("fp32_fitted_serialized", False)):
        fitted = bandwidth_for_fp32_scaling(profile, PAPER_PCIE_FP32, latency, overlap)
        result[name] = dict(compare_with_paper(profile, fitted, latency, overlap=overlap),
                            bandwidth_bytes_per_s=fitted)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("docs", "profiles",
                                                      "resnet50_2xv100_paper.json"))
    parser.add_argument("--compare", default=None, metavar="JSON",
                        help="compare the profile at --out with the paper's figure instead, "
                             "and write the comparison to this JSON")
    args = parser.parse_args(argv)
    from benchmarks.profile import load, save

    if args.compare:
        result = compare_all(load(args.out))
        for name, title in (
                ("pcie3", "PCIe 3.0"),
                ("fp32_fitted", "link rate fitted to the paper's fp32 scaling"),
                ("fp32_fitted_serialized", "link rate fitted to the paper's fp32 scaling, "
                                           "the exchange not overlapping backprop")):
            print("\n%s:\n\n%s" % (title, comparison_table(result[name])))
        nvlink = result["nvlink"]["rows"][0]
        print("\nNVLink fp16: paper %d -> %d, simulated %.0f -> %.0f"
              % (nvlink["paper_layerwise"], nvlink["paper_mergecomp"], nvlink["sim_layerwise"],
                 nvlink["sim_mergecomp"]))
        print("fitted link rate: %.2f GB/s overlapping, %.2f GB/s not"
              % (result["fp32_fitted"]["bandwidth_bytes_per_s"] / 1e9,
                 result["fp32_fitted_serialized"]["bandwidth_bytes_per_s"] / 1e9))
        with open(args.compare, "w") as f:
            json.dump(result, f, indent=1)
        return 0
    profile = build()
    save(profile, args.out)
    print("written: %s (%d tensors, step %.1f ms)" % (args.out, len(profile["tensors"]["sizes"]),
                                                      1e3 * profile["compute"]["step_s"]))
    return 0



# ---- the paper's figure, and the simulator against it -----------------------------------

# Scaling factor (%) on 2 V100s over PCIe, layer-wise -> MergeComp, from the paper's figure.
PAPER_PCIE = {"fp16": (53, 65), "dgc": (30, 90), "topk": (19, 19), "randomk": (37, 68),
              "qsgd": (38, 72), "efsignsgd": (41, 84), "signsgd": (48, 88), "onebit": (32, 81),
              "signum": (40, 84)}
PAPER_PCIE_FP32 = 48
PAPER_NVLINK = {"fp16": (91, 99)}


def _rank(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a, b):
    import numpy as np

    if len(a) < 2:
        return None
    ra, rb = np.asarray(_rank(a)), np.asarray(_rank(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / np.sqrt((ra * ra).sum() * (rb * rb).sum()))


def compare_with_paper(profile, bandwidth_bytes_per_s, latency_s, figures=None, overlap=True):
    """Per codec: the paper's layer-wise and MergeComp scaling factors (%) and the
    simulator's (layer-wise, searched) on 2 workers, with the gaps in points;
    ``overlap`` as in ``Simulation``."""
    from benchmarks.simulate import Simulation
    from benchmarks.network_model import NetworkCosts

    figures = figures or PAPER_PCIE
    simulation = Simulation(profile, overlap=overlap)
    network = NetworkCosts(2, bandwidth_bytes_per_s, latency_s)
    local = simulation.local_step
    fp32_s = simulation.horovod("fp32", network)[1]
    rows = []
    for codec, (paper_lw, paper_mc) in figures.items():
        results, _ = simulation.codec_configs(codec, network, plain_horovod_s=fp32_s)
        sim_lw = 100 * local / results["layer-wise"][1]
        sim_mc = 100 * local / results["searched"][1]
        per_group = results.get("searched per-group")
        rows.append({"codec": codec, "paper_layerwise": paper_lw, "paper_mergecomp": paper_mc,
                     "paper_gain": paper_mc - paper_lw, "sim_layerwise": sim_lw,
                     "sim_mergecomp": sim_mc, "sim_gain": sim_mc - sim_lw,
                     "sim_groups": len(results["searched"][0]) + 1,
                     # the search with per-group codecs and the plain-Horovod sentinel
                     "sim_per_group": None if per_group is None else 100 * local / per_group[1],
                     "sim_per_group_layout": None if per_group is None else _layout_words(
                         per_group[0], per_group[2]),
                     "gap_layerwise": sim_lw - paper_lw, "gap_mergecomp": sim_mc - paper_mc})
    fp32 = 100 * local / fp32_s
    result = {"rows": rows, "fp32": fp32}
    for column in ("gain", "layerwise", "mergecomp"):
        result["%s_rank_correlation" % column] = spearman(
            [r["paper_" + column] for r in rows], [r["sim_" + column] for r in rows])
    return result


def bandwidth_for_fp32_scaling(profile, target_percent, latency_s, overlap=True, low=1e7,
                               high=1e12):
    """The link rate at which the simulated Horovod fp32 scaling factor on 2 workers
    is ``target_percent`` (bisection in log space); ``overlap`` as in ``Simulation``."""
    import math

    from benchmarks.simulate import Simulation
    from benchmarks.network_model import NetworkCosts

    simulation = Simulation(profile, overlap=overlap)

    def scaling(rate):
        step = simulation.horovod("fp32", NetworkCosts(2, rate, latency_s))[1]
        return 100 * simulation.local_step / step

    for _ in range(60):
        middle = math.sqrt(low * high)
        if scaling(middle) < target_percent:
            low = middle
        else:
            high = middle
    return math.sqrt(low * high)


if __name__ == "__main__":
    sys.exit(main())
