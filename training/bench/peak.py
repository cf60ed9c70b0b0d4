"""The bf16 matrix-multiply peak this GPU really reaches, for an MFU against measurement beside the datasheet's.

    python -m training.bench.peak [--size 8192] [--iters 50]

Square bf16 matmuls (C = A @ B, n x n, 2n^3 FLOPs each) after a warm-up, timed with CUDA events; prints one JSON
line: the TFLOP/s of the best of five timed rounds, the device and the settings. A GPU only.
"""

from __future__ import annotations

import argparse
import json

import torch


def matmul_tflops(size: int = 8192, iters: int = 50, rounds: int = 5) -> float:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    best = 0.0
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        best = max(best, 2 * size**3 * iters / seconds / 1e12)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("no GPU: the measured matmul peak is a GPU figure")
    tflops = matmul_tflops(args.size, args.iters)
    print(
        json.dumps({"device": torch.cuda.get_device_name(), "size": args.size, "iters": args.iters, "tflops": tflops})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
