"""The learned synchronization policy (paper 004): instances, Q-network training, evaluation."""
