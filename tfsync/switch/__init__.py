"""Sync-Switch: configuration policy at a switch; timing and straggler policies (issue 5)."""
