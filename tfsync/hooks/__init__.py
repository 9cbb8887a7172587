"""The per-node hook agent: starts, stops and restarts a node's TF tasks (issue 3)."""
