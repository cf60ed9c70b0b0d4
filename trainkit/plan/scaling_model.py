"""A scaling model on paper: step time, tokens/s and efficiency on 1..64 nodes for each sharding strategy.

    step time = compute + exposed communication

compute: the model FLOPs of one GPU's share of the step at an MFU (taken from a `invoke bench train` results
file when one exists for the model on that accelerator, else the planner's assumption) of the datasheet peak.

communication: the collectives each strategy issues per optimizer step, each timed on a two-level fabric
(`collective_time`): the NVLink stage (each GPU's share of the bytes at its NVLink bandwidth; NVSwitch gen3 on
H100/H200 reduces in the switch, so an all-reduce sends each byte once) and, across nodes, the network stage bound
by the node's network bandwidth, pipelined so the slower stage counts, plus a latency per level of the
inter-node tree. Bus volumes are those of nccl-tests' doc/PERFORMANCE.md (all-gather and reduce-scatter (k-1)/k,
all-reduce 2(k-1)/k of the payload, k participants), at the node level across nodes. ZERO_1 is DeepSpeed 0.19.8's
ZeRO stage 1 as trainkit configures it (trainkit/plan/data_parallel.py): the bf16 gradients all-reduced once per
step, one all-reduce per 5e8-element reduce bucket (`use_multi_rank_bucket_allreduce`, default true, all-reduces a
bucket instead of reducing each slice to the rank that owns it: runtime/zero/stage_1_and_2.py `average_tensor`),
then each rank's updated bf16 partition all-gathered into every rank's weights: 1.5 times an all-reduce's bytes.
The ZeRO paper's reduce-scatter + all-gather (Rajbhandari et al. 2020, section 7.2) moves one all-reduce's; DeepSpeed
shipped that "partition-aware" stage 1 in 2020 ("total communication volume reduction 1.5x -> 1x", deepspeed.ai
2020-03-17 "ZeRO stage 1 with reduced communication") and 0.19.8's default all-reduces again.

overlap (the stated assumption): collectives run under compute that does not depend on them: all of a step's
communication under the step's compute (prefetched all-gathers, reduce-scatters behind the next layer's backward),
and the gradients' collectives (reduced once per step: the trainer turns gradient sync off until the last micro
batch) under the last micro batch's backward, 2/3 of its compute. What exceeds either window is exposed. One unit
of communication can never hide: the first all-gather and last reduce-scatter of FSDP (the largest unit: a
decoder layer or the embedding/LM head), DDP's last gradient bucket (25 MiB, torch's default bucket_cap_mb).
ZeRO-1 overlaps nothing: DeepSpeed reduces the gradients in `engine.step()`, after the last backward (`overlap_comm`
is off below stage 3, and refused with the `managed_gradient_accumulation: false` trainkit uses: engine.py), and
gathers the weights after the optimizer step.

Weak scaling, as published scaling tables measure it: every GPU keeps its micro batch and gradient accumulation
from the one-node plan, the global batch grows with the nodes. Efficiency at n nodes = per-GPU throughput at n
over per-GPU throughput at the smallest size (1 node, or the fewest nodes where the job fits).

Per instance family one set of parameters (`FABRICS`): the datasheet links and two numbers for the collective
software stack — the fraction of a link's nominal bandwidth a large collective reaches and the latency per
inter-node tree level — fitted once to AWS's published 2 x p5 nccl-tests all-reduce bus bandwidth (the 16 MiB
and 16 GiB rows; the 128 MiB and 2 GiB rows are predictions) and carried to p4d and p3, which have no published
collective table here. dl1 (Gaudi, whose scale-out goes through the host's EFA devices) gets its own network
efficiency, fitted to one row of the BERT-Large table. `trainkit/tables/published_scaling.json` holds the
published tables and the workload parameters used for each; `compare_published` puts prediction beside
publication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from training.common.flops import PEAK_BF16_TFLOPS
from training.spec import SHARDING_CHOICES, ZERO_1
from trainkit.errors import SpecError
from trainkit.hardware import INSTANCE_TYPES
from trainkit.plan.data_parallel import DS_REDUCE_BUCKET_ELEMENTS

NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
DDP_BUCKET_BYTES = 25 * 1024**2  # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)
BACKWARD_SHARE = 2 / 3  # backward is twice the forward's FLOPs: the window DDP's all-reduce can hide in
GIB, MIB = 1024**3, 1024**2

# The collective stack, fitted once on p5 (see the module docstring and `fit_collectives`): a large collective
# reaches 65% of a link's nominal bandwidth; each inter-node tree level costs 235 us.
LINK_EFFICIENCY = 0.65
TREE_LEVEL_LATENCY_S = 235e-6
NVLINK_LATENCY_S = 20e-6  # one node's collective start-up; assumed (NCCL's intra-node latencies are tens of us)
# dl1 has no published collective table: its inter-node efficiency is fitted to the BERT-Large table's 8-node row
# (`fit_inter_efficiency("bert-large-dl1", 8)`, with ZeRO-1's bytes as DeepSpeed 0.19.8 moves them), and the BERT
# 1.5B table is then predicted. It is under a fifth of p5's; the likely cause: on DL1 the Gaudis reach other nodes
# through the host's EFA devices, not their own ports.
DL1_INTER_EFFICIENCY = 0.1184


@dataclass(frozen=True)
class Fabric:
    """One instance family's accelerators and links as the model sees them."""

    family: str
    accelerator: str
    per_node: int
    peak_tflops: float | None  # dense bf16/fp16 per accelerator; None: not published (the tables anchor compute)
    intra_gb_s: float  # per accelerator, one direction (NVLink or the on-chip RoCE ports of Gaudi)
    inter_gb_s: float  # per node, one direction (EFA, or the ENA network where there is no EFA)
    source: str
    inter_efficiency: float = LINK_EFFICIENCY  # of inter_gb_s a large collective reaches
    intra_efficiency: float = LINK_EFFICIENCY  # of intra_gb_s (not fitted anywhere: p5's network figure)
    tree_latency_s: float = TREE_LEVEL_LATENCY_S
    intra_latency_s: float = NVLINK_LATENCY_S
    switch_reduction: bool = False  # NVSwitch gen3 (H100/H200 HGX) reduces in the switch (NVLS)


FABRICS = {
    "p5": Fabric(
        "p5",
        "H100",
        8,
        PEAK_BF16_TFLOPS["H100"],
        450.0,
        400.0,
        "EC2 P5: 8 x H100 SXM, 900 GB/s NVLink per GPU (both directions) through NVSwitch gen3 with in-switch "
        "reduction, 3,200 Gbps EFA per node",
        switch_reduction=True,
    ),
    "p4d": Fabric(
        "p4d",
        "A100",
        8,
        PEAK_BF16_TFLOPS["A100"],
        300.0,
        50.0,
        "EC2 P4d: 8 x A100 SXM, 600 GB/s NVLink per GPU (both directions), 400 Gbps EFA per node",
    ),
    "p3": Fabric(
        "p3",
        "V100",
        8,
        125.0,
        150.0,
        25 / 8,
        "EC2 P3 (p3.16xlarge): 8 x V100 SXM2 (125 TFLOP/s fp16 tensor), NVLink 300 GB/s per GPU (both "
        "directions), 25 Gbps network, no EFA",
    ),
    "dl1": Fabric(
        "dl1",
        "Gaudi",
        8,
        None,
        43.75,
        50.0,
        "EC2 DL1 (dl1.24xlarge): 8 x Gaudi in a full RoCE mesh, 700 Gbps per Gaudi both directions, 400 Gbps EFA "
        "per node (as the AWS DL1 DeepSpeed post describes the instance)",
        inter_efficiency=DL1_INTER_EFFICIENCY,
    ),
}
FAMILY_OF_INSTANCE = {"p5.48xlarge": "p5", "p5e.48xlarge": "p5", "p5en.48xlarge": "p5"}
FAMILY_OF_INSTANCE |= {"p4d.24xlarge": "p4d", "p4de.24xlarge": "p4d"}


def fabric_for(instance_type: str) -> Fabric:
    family = FAMILY_OF_INSTANCE.get(instance_type)
    if family is None:
        raise SpecError(f"--instance-type {instance_type}: the scaling model describes {', '.join(FAMILY_OF_INSTANCE)}")
    fabric = FABRICS[family]
    gpu = INSTANCE_TYPES[instance_type].gpu
    if gpu != fabric.accelerator:  # p5e/p5en: H200, same core and links as p5's H100 for this model
        fabric = Fabric(**{**fabric.__dict__, "accelerator": gpu, "peak_tflops": PEAK_BF16_TFLOPS[gpu]})
    return fabric


# --------------------------------------------------------------------------- collectives

BUS_FACTOR = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}


def collective_time(kind: str, payload: float, nodes: int, fabric: Fabric) -> float:
    """Seconds for one collective over `payload` bytes (the whole tensor: gathered, or reduced) among all GPUs
    of `nodes` nodes: the NVLink stage, and across nodes the network stage, pipelined (the slower one counts)."""
    g = fabric.per_node
    if kind == "all_reduce" and fabric.switch_reduction:
        intra_volume = 1.0  # NVLink SHARP: each GPU sends its bytes once, the switch reduces and multicasts
    else:
        intra_volume = BUS_FACTOR[kind] * (g - 1) / g
    intra = intra_volume * payload / (fabric.intra_efficiency * fabric.intra_gb_s * 1e9)
    if nodes == 1:
        return fabric.intra_latency_s + intra
    inter = BUS_FACTOR[kind] * (nodes - 1) / nodes * payload / (fabric.inter_efficiency * fabric.inter_gb_s * 1e9)
    return fabric.tree_latency_s * math.ceil(math.log2(nodes)) + max(intra, inter)


def allreduce_busbw(payload: float, nodes: int, fabric: Fabric) -> float:
    """nccl-tests' all_reduce_perf bus bandwidth (bytes/s) the model predicts for `nodes` full nodes."""
    n = nodes * fabric.per_node
    return payload / collective_time("all_reduce", payload, nodes, fabric) * 2 * (n - 1) / n


def fit_collectives(small: tuple[float, float], large: tuple[float, float], nodes: int, fabric: Fabric):
    """(link efficiency, tree-level latency) that reproduce two all-reduce rows (bytes, busbw bytes/s) of
    nccl-tests: the large one fixes the bandwidth, the small one the latency. How the constants were found."""
    n = nodes * fabric.per_node
    volume = 2 * (nodes - 1) / nodes

    def seconds(row):
        size, busbw = row
        return size * 2 * (n - 1) / n / busbw

    levels = math.ceil(math.log2(nodes))
    # t = levels * latency + volume * size / (eff * B): two rows, two unknowns.
    (s1, t1), (s2, t2) = (small[0], seconds(small)), (large[0], seconds(large))
    per_byte = (t2 - t1) / (s2 - s1)
    efficiency = volume / (per_byte * fabric.inter_gb_s * 1e9)
    latency = (t1 - per_byte * s1) / levels
    return efficiency, latency


# --------------------------------------------------------------------------- one step's cost


@dataclass(frozen=True)
class StepCost:
    """What one GPU does per optimizer step, for the model."""

    params: float  # parameters communicated (the whole model)
    compute_s: float  # one GPU's forward + backward + optimizer at the assumed MFU
    micro_batches: int  # gradient accumulation steps
    largest_unit: float  # parameters of the largest FSDP unit (a layer, or embedding / LM head)
    param_bytes: int = 2  # bf16 working copies all-gathered by FSDP
    grad_bytes: int = 2  # bytes per gradient element reduced (the trainers' default fp32: memory.py step_cost)
    ddp_grad_bytes: int | None = None  # DDP's gradients (trainkit's: the fp32 parameters' fp32 gradients)


@dataclass(frozen=True)
class Point:
    nodes: int
    strategy: str
    compute_s: float
    communication_s: float
    exposed_s: float
    step_s: float
    efficiency: float = 1.0


def strategy_communication(workload: StepCost, strategy: str, nodes: int, fabric: Fabric) -> tuple[float, ...]:
    """(all communication seconds per step, the gradients' share of it, the part that can never overlap) for one
    strategy. Gradients are reduced once per step, in the last micro batch's backward (the trainer turns gradient
    sync off for the others); parameters are gathered in every micro batch's forward (and backward)."""
    w, f = workload, fabric
    params, grads = w.params * w.param_bytes, w.params * w.grad_bytes
    unit_params, unit_grads = w.largest_unit * w.param_bytes, w.largest_unit * w.grad_bytes

    def gather(size):
        return collective_time("all_gather", size, nodes, f)

    def scatter(size):
        return collective_time("reduce_scatter", size, nodes, f)

    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):  # FULL_SHARD gathers in forward and again in backward
        gathers = (2 if strategy == "FULL_SHARD" else 1) * w.micro_batches * gather(params)
        gradients = scatter(grads)
        return gathers + gradients, gradients, gather(unit_params) + scatter(unit_grads)
    if strategy == "HYBRID_SHARD":  # FULL_SHARD inside the node, the shards' gradients all-reduced across nodes
        gathers = 2 * w.micro_batches * collective_time("all_gather", params, 1, f)
        gradients = collective_time("reduce_scatter", grads, 1, f)
        # each GPU's shard (1/g of the gradients) all-reduced with its peers on the other nodes, over the network
        network = replace(f, intra_gb_s=math.inf)
        if nodes > 1:
            gradients += collective_time("all_reduce", grads, nodes, network)
        tail = collective_time("all_gather", unit_params, 1, f) + collective_time("reduce_scatter", unit_grads, 1, f)
        if nodes > 1:
            tail += collective_time("all_reduce", unit_grads, nodes, network)
        return gathers + gradients, gradients, tail
    if strategy == "NO_SHARD":  # DDP: one bucketed all-reduce of the gradients per step
        grads = w.params * (w.ddp_grad_bytes or w.grad_bytes)
        bucket = min(DDP_BUCKET_BYTES, grads)
        everything = collective_time("all_reduce", grads, nodes, f)
        return everything, everything, collective_time("all_reduce", bucket, nodes, f)
    if strategy == ZERO_1:  # DeepSpeed: gradients all-reduced bucket by bucket, then the new weights all-gathered
        buckets = max(1, math.ceil(w.params / DS_REDUCE_BUCKET_ELEMENTS))
        reduced = buckets * collective_time("all_reduce", grads / buckets, nodes, f)
        everything = reduced + gather(params)
        return everything, reduced, everything  # after the backward and the step: nothing overlaps
    raise SpecError(f"unknown strategy {strategy!r}; choose one of: {', '.join(SHARDING_CHOICES)}")


def predict(workload: StepCost, strategy: str, nodes: int, fabric: Fabric) -> Point:
    """Overlap: all communication hides under the step's compute, and the gradients' under the last micro batch's
    backward (2/3 of its compute); whatever exceeds either window is exposed, and the last unit always is."""
    communication, gradients, tail = strategy_communication(workload, strategy, nodes, fabric)
    last_backward = workload.compute_s / workload.micro_batches * BACKWARD_SHARE
    exposed = max(0.0, communication - tail - workload.compute_s, gradients - tail - last_backward) + tail
    return Point(nodes, strategy, workload.compute_s, communication, exposed, workload.compute_s + exposed)


def curve(workload: StepCost, strategy: str, fabric: Fabric, node_counts=NODE_COUNTS, base_nodes=1) -> list[Point]:
    """Predictions for each node count, with efficiency (per-GPU throughput) against `base_nodes`."""
    points = [predict(workload, strategy, n, fabric) for n in node_counts]
    base = predict(workload, strategy, base_nodes, fabric).step_s
    return [Point(**{**p.__dict__, "efficiency": base / p.step_s}) for p in points]


# --------------------------------------------------------------------------- published tables
