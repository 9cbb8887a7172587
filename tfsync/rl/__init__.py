"""The learned synchronization policy (RLP): instances, Q-network training, evaluation."""
