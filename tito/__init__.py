"""TITO Gateway: exact tokens of multi-turn agent rollouts for RL trainers."""

__version__ = "0.1.0"
