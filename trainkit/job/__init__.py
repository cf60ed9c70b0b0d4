"""The job model on the launcher's side: profiles, the model registry, and the pure steps that turn what
the user gave into a complete, checked job (the fields themselves are declared once, in
training/spec/, which the training workers read too)."""

from training.spec import Job
from trainkit.job.build import Machine, build, load_profile
from trainkit.job.derive import derive
from trainkit.job.models import REGISTRY, get_model
from trainkit.job.validate import validate

__all__ = ["REGISTRY", "Job", "Machine", "build", "derive", "get_model", "load_profile", "validate"]
