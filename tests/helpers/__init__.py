"""What the tests share: modules of helpers (imported by tests and conftest files), and the scripts some
tests run under torchrun (guard_check.py, silent_peer.py, vision_replica_check.py), never imported."""
