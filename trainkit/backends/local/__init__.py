"""The local backend: torchrun agents on this machine (backend.py), a task in the launcher's process (task.py),
the console a user watches (console.py) and the runs folder's bookkeeping: the run lock, state and the failure
record (runs.py)."""
