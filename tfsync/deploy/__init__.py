"""Where tfsync jobs are deployed: Kubernetes manifests for a job file (``k8s``: the job's
shape and checks; ``manifests``: the objects as plain dicts; ``yamltext``: their YAML)."""
