"""Other RL frameworks on our data and rewards: `export` writes a dataset root as verl or EasyR1 parquet
(`embodied export`), `verl_reward` is the reward entry point those frameworks load (docs/scaling.md)."""
