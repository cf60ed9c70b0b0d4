"""The EKS backend: a Kubeflow PyTorchJob per run on the cluster `make up PROFILE=aws` made (backend.py), a task
as a batch/v1 Job (task.py), and everything only EKS needs: the platform's names (cluster.py), the manifests
(render.py), the job's EKS rules and paths on FSx (rules.py), the submit-time checks against the cluster
(preflight.py), the API client (kube.py), the pod entry point (pod.py) and Grafana's port-forward (grafana.py)."""
