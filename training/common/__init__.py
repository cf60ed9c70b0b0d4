"""Pieces shared by every workload: checkpointing, metrics, FLOPs accounting, distributed setup."""
