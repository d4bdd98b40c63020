"""What the RL trainers (``policy_gradient.py``: REINFORCE / RLOO / GRPO; ``ppo.py``) share around their own rollout
and update: ``common.py``."""
