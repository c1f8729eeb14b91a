"""reasonrl: RL for long chain-of-thought reasoning (DAPO, VC-PPO)."""
__version__ = "0.1.0"
