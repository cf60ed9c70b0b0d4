"""trainkit: launch, plan and observe distributed training jobs, locally or on EKS.

The package never imports torch at module level: `invoke plan` and spec validation run in
a fraction of a second and on machines without PyTorch.
"""

__version__ = "0.1.0"
