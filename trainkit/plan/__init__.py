"""Estimates before anything runs or is paid for, and the report after: memory, time and cost of a job
(memory.py, `invoke plan`; data_parallel.py: what ZeRO-1 and DDP keep per GPU), the scaling model
(scaling_model.py) and a job's scaling across nodes (scaling.py, `invoke plan --scaling`), the model held against
published tables (published.py, `--published`), and a run's report PNG (report.py, `invoke obs.report`). What it
costs: prices.py (today's AWS prices, or the shipped table) and cost.py (the plan's cost section; `make up`'s
estimate and `invoke status` price the same way)."""
