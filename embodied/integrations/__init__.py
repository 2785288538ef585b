"""Other frameworks on our data: `export` writes a dataset root as verl or EasyR1 parquet (`embodied export`)
and `verl_reward` is the reward entry point those frameworks load (docs/scaling.md); `lmms_export` writes it
as an lmms-eval task folder whose hooks (`lmms_eval`) score with our parser, metrics and physics
(docs/evaluation.md)."""
