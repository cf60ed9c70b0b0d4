"""SageMaker Training: a job as a CreateTrainingJob request (backend.py, request.py), what the infra stack gives it
(stack.py), and the entry point on every instance (host.py)."""
