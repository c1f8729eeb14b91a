"""Evaluation: AIME-style avg@n, pass@k, maj@n with bootstrap CIs (see ``metrics``)."""
