"""Training loops: `sft.train_sft` and `grpo.train_grpo`, each one function read top to bottom."""
