"""Reinforcement-learning pieces as pure functions of tensors: rewards, advantages, losses."""
