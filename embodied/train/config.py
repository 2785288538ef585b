"""The `sft:`, `grpo:` and `expert:` sections: the settings of the three training loops
(`embodied.train.sft.train_sft`, `grpo.train_grpo`, `expert.train_expert`), beside them. Kept free of heavy
imports (no torch) because `embodied.config` imports it for every command.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SFTConfig:
    """Supervised fine-tuning on the generated questions (targets: `tasks.sft_target`)."""

    steps: int = 200
    """Optimizer steps."""
    batch_size: int = 32
    micro_batch_size: int = 0
    """Rows per forward and backward pass (0: the whole batch in one). The batch's gradient is accumulated
    over micro-batches of rows of similar prompt length (sorted by length, each padded to its own longest
    prompt), and the loss stays the mean over the whole batch's target tokens, so the update is the
    whole-batch one up to float rounding. It caps activation memory (a real checkpoint on one GPU) and skips
    the padding of a mix of short and long prompts (`embodied bench sft`)."""
    lr: float = 1e-3
    """Peak learning rate (AdamW) of the language model, reached after `warmup_steps`, then cosine to 10%."""
    warmup_steps: int = 10
    vision_lr_scale: float = 1.0
    """Learning rate of the vision tower relative to `lr`. The randomly initialised tiny model (`tiny`) needed
    10 here (and warm restarts) to find the clip at all; the perception-pretrained base does not
    (docs/perception.md)."""
    restart_every: int = 0
    """Warm restarts (SGDR): every this many steps a fresh AdamW and a new warmup + cosine (0 = off)."""
    rationale: str = "none"
    """What SFT targets carry inside `<think>` before the letter (`tasks.RATIONALES`): none (empty) |
    template (the family's fixed sentence, `reasoning_for`) | trace (the simulator-derived trace,
    `trace_for`: on the puzzles each shown piece's place in the original, then the order, e.g.
    `3 1 2 -> 2, 3, 1`). A trace is a target, never an input. It makes responses longer: evaluation and
    GRPO need `max_new_tokens` at least the longest target (48 tokens with a 3x3 arrangement; the cosmos
    main job checks; docs/cosmos.md)."""
    rationale_families: list[str] = field(default_factory=list)
    """The families whose targets carry `rationale` (empty: every family); the others get an empty
    `<think>`. E.g. `[temporal_puzzle, spatial_puzzle]` keeps the puzzles' traces (each piece's place) and
    spares object permanence a one-word trace it then has to match to an option sentence (docs/cosmos.md)."""
    answer_weight: float = 1.0
    """Weight of the tokens inside `<answer>...</answer>` in the loss, relative to every other target token
    (the mean stays over target tokens, so 1 is the plain mean). With a trace the letter is 1 of about 17
    target tokens; a larger weight gives matching the written order to its option more of the gradient
    (docs/cosmos.md, "measured levers")."""
    answer_as: str = "letter"
    """What targets write inside `<answer>` (`tasks.ANSWER_AS`): letter | order (on ordering questions, the
    temporal puzzle and the spatial arrangement, the right order, `2, 3, 1`; the letter elsewhere) | text (the
    right option's text on every question). Rewards and evaluation read each as the option it names
    (`tasks.chosen_option`), so `order` takes matching a written order to its letter out of the task. The
    prompt still asks for the letter, and forced-choice accuracy still scores letters."""
    targets: str = "answer"
    """answer: the correct letter | format: a uniformly random option letter, drawn anew at every step, so
    SFT teaches the answer format and never the answer (the zero-label start for GRPO)."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 100
    """Greedy accuracy on `eval_examples` validation clips every this many steps (0 = never)."""
    eval_examples: int = 100
    stop_at: float = 0.0
    """Stop at the first validation whose accuracy reaches this (0 = never): e.g. a start that half-solves
    its questions, for a recipe comparison (`embodied experiment recipes`)."""
    max_seconds: float = 0.0
    """Stop after the first step that ends this many seconds into training (0 = no limit): continued SFT on
    the same wall time as an RL stage (`embodied experiment cosmos`)."""
    checkpoint_every: int = 100
    """Write a resumable checkpoint every this many steps and at the end (0 = never)."""
    keep_checkpoints: int = 2


@dataclass
class PPOConfig:
    """`grpo.ppo.*`: PPO's critic, the advantage estimator of `grpo.advantage=gae` (`embodied.rl.critic`): a
    value head on the policy's last hidden states, trained alongside it, and GAE against its values. These
    keys act only with `advantage=gae` (docs/recipes.md says why the defaults)."""

    gamma: float = 1.0
    """Discount per completion token (1, TRL's default: the reward reaches every token
    whole)."""
    lam: float = 1.0
    """GAE's lambda (Schulman et al. 2016): 0 gives one-step TD errors (the critic's bias),
    1 Monte-Carlo returns minus the value (their variance); TRL's 0.95 needs `value_level=token`."""
    value_lam: float | None = None
    """GAE's lambda for the critic's targets only (VC-PPO's decoupled GAE); None = `lam`.
    1 (with gamma 1): every token's target is its Monte-Carlo return-to-go, independent of the critic's own
    values, while the policy's advantages keep `lam`."""
    vf_coef: float = 0.1
    """Weight of the critic's value loss in the total loss, policy + vf_coef * value
    (TRL's 0.1)."""
    value_clip: float = 0.2
    """The clipped value loss keeps each new value within this of the rollout-time one
    (OpenAI baselines' ppo2, TRL's cliprange_value 0.2); 0 = plain squared error."""
    whiten: bool = True
    """Normalise the advantages over the batch's tokens (`whiten_std` says how far); False
    keeps them as GAE gives them, in reward units."""
    whiten_std: bool = False
    """Advantage=gae, with `whiten`: divide by the batch's std too (full whitening); False centres only
    (subtract the batch mean, keep reward units): the centring removes the critic's error common to the
    batch, the division would scale its per-answer error up to unit size when the rewards barely vary. True
    (TRL's, OpenRLHF's, verl's whitening) collapsed the tiny policy on 2 seeds of 3 (docs/recipes.md)."""
    value_lr_scale: float = 10.0
    """Learning rate of the value head relative to `lr`. The head starts at zero and has to
    reach the return's level (~1.4 here) within the value clip's 0.2 per rollout, so it learns faster than
    the policy (verl's and OpenRLHF's PPO examples give the critic 10-20x the actor's lr)."""
    value_level: str = "sequence"
    """Token (V(s_t) before every completion token, PPO's critic) | sequence (the prompt's
    value V(s_0) is every token's baseline and the only value trained, on the whole return: a learned
    per-question baseline, the same on every token of an answer; needs gamma = lam = 1). Per-token values
    put the critic's per-position error into the advantages of the answer format's tokens, which every
    answer shares, and so push them the same way on every answer (docs/recipes.md)."""
    value_hidden: int = 64
    """Hidden units of a layer of the value head's own (Linear -> tanh -> Linear); 0 = one
    linear layer on the policy's last hidden states."""
    value_detach: bool = True
    """Stop the value loss's gradient at the head's input, so the critic never reshapes the
    shared backbone (the policy then moves by the policy loss alone)."""
    value_warmup_steps: int = 5
    """The first this many steps train the value head alone (policy frozen, nothing but the
    head stepped), so the first policy updates meet a critic that already predicts the returns' level
    (OpenRLHF's freezing_actor_steps, verl's critic_warmup)."""
    value_ev_patience: int = 10
    """Warn when the critic's explained variance has stayed below 0 for this many steps in a
    row: its values are then worse than a constant, and the advantages are mostly its error (0 = never)."""
    kl_in_reward: bool = False
    """Put the KL to the reference in the reward instead of the loss (InstructGPT, Ouyang et al. 2022, Eq. 2;
    TRL's PPO): every completion token's reward gets `- grpo.kl_coef * KL`, the `grpo.kl_estimator` estimate
    from the sampling policy's and the reference's log-probs, once per rollout, and the loss has no KL term
    (PPO only: the per-token rewards go through GAE)."""


@dataclass
class PAPOConfig:
    """`grpo.papo.*`: PAPO (Wang et al. 2025), the implicit perception loss on masked visual input."""

    enabled: bool = False
    """Perception-aware policy optimisation: add PAPO's implicit perception loss on masked visual input."""
    gamma: float = 0.01
    """Weight of the perception KL (maximised)."""
    mask_prob: float = 0.6
    """Probability of blackening each vision patch."""
    consistent: bool = True
    """Video: blacken the same patch positions in every temporal patch (False: draw each anew)."""
    entropy_real: float = 0.03
    entropy_masked: float = 0.03
    """PAPO's double entropy regulariser weights (eta1 on the real branch, eta2 on the masked one)."""
    masked_grad: bool = False
    """Let gradient flow through the masked branch too (PAPO's released runs: no)."""


@dataclass
class CovConfig:
    """`grpo.cov.*`: covariance-based entropy control (Cui et al. 2025), Clip-Cov or KL-Cov."""

    mode: str = "none"
    """None | clip_cov | kl_cov: covariance-based entropy control (Cui et al. 2025)."""
    ratio: float = 2e-4
    """Fraction of tokens Clip-Cov detaches / KL-Cov penalises (at least one token)."""
    clip_low: float = 1.0
    clip_high: float = 5.0
    """Clip-Cov picks its tokens among those with `clip_low` < covariance < `clip_high`."""
    kl_coef: float = 1.0
    """KL-Cov's weight on |log ratio| for the selected tokens."""


@dataclass
class OverlongConfig:
    """`grpo.overlong.*`: DAPO's overlong reward shaping of answers that reach `grpo.max_new_tokens`."""

    mode: str = "off"
    """Off | hard (truncated answers get -1) | soft (ramps down over the last `buffer` tokens)."""
    buffer: int = 8
    weight: float = 1.0


@dataclass
class GRPOConfig:
    """Group Relative Policy Optimization (DeepSeekMath) with rule-based MCQ rewards."""

    steps: int = 200
    prompts_per_step: int = 32
    group_size: int = 4
    """Responses sampled per prompt (G); advantages are normalised within each group. For a two-option
    question 32 x 4 learns faster than 8 x 8 at the same cost: each prompt's group tells which letter is
    right, so the prompts per step are the labels per step (docs/perception.md)."""
    max_new_tokens: int = 16
    temperature: float = 1.0
    temperatures: list[float] = field(default_factory=list)
    """Per group member: member g samples at `temperatures[g % len]` (empty: all at `temperature`).
    Log-probs are always computed at each sample's own temperature."""
    lr: float = 5e-4
    """Constant AdamW learning rate (5e-4 for the tiny base; a 3B checkpoint wants ~1e-6)."""
    vision_lr_scale: float = 1.0
    """Learning rate of the vision tower relative to `lr` (as in SFT)."""
    clip_eps: float = 0.2
    """Lower clip range of the ratio (and the upper one unless `clip_eps_high` is set)."""
    clip_eps_high: float | None = None
    """Upper clip range; DAPO's clip-higher uses 0.28 with clip_eps 0.2."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (None = off)."""
    advantage: str = "grpo"
    """grpo (group mean/std) | drgrpo (group mean only) | rloo (leave-one-out) | reinforce_pp (batch std) |
    gae (PPO: a learned critic, a value head on the policy's last hidden states, is the baseline; per-token
    GAE advantages, centred over the batch; no group needed, so group_size 1 works; its settings are
    `grpo.ppo.*`) | any name registered with `embodied.rl.advantages.register_estimator`."""
    loss_agg: str = "seq-mean-token-mean"
    """seq-mean-token-mean (GRPO) | token-mean (DAPO) | seq-sum-norm (Dr. GRPO, divided by max_new_tokens)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 estimator of the KL to the reference."""
    kl_coef: float = 0.1
    """Weight of the KL to the frozen initial policy; 0 drops the reference model entirely. From a start that
    answers each letter half the time, the KL holds the letters apart until the clip decides them: without it
    the tiny policy collapsed to one letter within 50 steps (docs/perception.md)."""
    ratio_level: str = "token"
    """token (PPO/GRPO importance ratio per token) | sequence (GSPO's length-normalised sequence ratio)."""
    is_correction: str = "sequence_mask"
    """The sampler/trainer importance-sampling correction under a rollout engine with log-probs of its own
    (`rollout.engine=vllm`; `rl.losses.engine_is_weights`): off | token_truncate | token_mask |
    sequence_truncate | sequence_mask (TRL's default). Each token's policy-gradient term is weighted by
    r = pi_old / pi_engine, per token or per sequence (the product over its tokens), truncated at `is_cap`
    or masked (0) outside [`is_floor`, `is_cap`]. With `rollout.engine=hf` the sampler is the trained model:
    there is nothing to correct and the loss is computed exactly as with `off` (docs/training.md,
    "Off-policy correction")."""
    is_cap: float = 3.0
    """The correction's upper bound on r (>= 1): truncated to it, or masked above it (TRL's 3.0)."""
    is_floor: float = 0.0
    """The `*_mask` modes' lower bound on r (0 to 1): a token or sequence below it gets weight 0. 0: none
    (TRL's default; OpenRLHF's icepop uses 0.5). Truncation caps from above only."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss subtracts entropy_coef * entropy of the sampling distribution."""
    dynamic_sampling: bool = False
    """DAPO: drop groups with equal rewards and draw more prompts until `prompts_per_step` groups remain."""
    max_sampling_rounds: int = 3
    """Cap on draws per step under dynamic sampling; a step trains on the groups kept by then."""
    mask_truncated: bool = False
    """Leave answers that hit `max_new_tokens` without ending out of the loss (DAPO's overlong filtering)."""
    updates_per_rollout: int = 1
    """mu: optimizer steps on each rollout, against the log-probs stored when it was sampled."""
    micro_batch_size: int = 0
    """Sequences per forward/backward pass (0 = the whole rollout); the gradient does not depend on it."""
    accuracy_weight: float = 1.0
    """Weight of `reward/accuracy` (the exact letter in the one `<answer>`) in `reward/total`."""
    format_weight: float = 0.5
    """Weight of `reward/format` (the `<think>...</think><answer>...</answer>` layout) in `reward/total`."""
    order_credit: float = 0.0
    """Partial credit on ordering questions (temporal puzzles, spatial-puzzle arrangements), 0 = off (exact
    match only). A wrong option earns this discount times the share of positions where its order agrees
    with the right option's, logged as `reward/order_credit` and weighted like accuracy; Visual Jigsaw
    (Wu et al. 2025) used 0.2. Training reward only: `reward/accuracy` and evaluation stay exact match."""
    reward_timeout_s: float = 60.0
    """A reward call (one batch) taking longer stops the run with an error instead of scoring anything."""
    grad_clip: float = 1.0
    log_every: int = 5
    eval_every: int = 0
    eval_examples: int = 100
    keep_best: bool = False
    """With `eval_every`: end on the weights of the held-out point with the highest validation accuracy (the
    latest of equals; the last step is always one), instead of the last step's. Selection on the
    validation split only, so the test split stays unseen; one process, no `resume` (the best weights are
    held in memory)."""
    checkpoint_every: int = 20
    """Write a resumable checkpoint every this many steps and at the end (0 = never)."""
    keep_checkpoints: int = 2
    target_kl: float | None = None
    """With `updates_per_rollout` > 1: stop a rollout's updates after the first whose approximate KL to the
    sampling policy (`drift/approx_kl`, k3 over the loss's tokens, measured in that update's forward pass)
    exceeds this (cleanrl's `target_kl`); None: always run all `updates_per_rollout`."""
    loss_terms: dict[str, float] = field(default_factory=dict)
    """Extra loss terms by name, with their weights: each name is a function registered with
    `embodied.rl.losses.register_loss`, added to the loss as weight * term (docs/training.md, "A new advantage
    estimator or loss")."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    papo: PAPOConfig = field(default_factory=PAPOConfig)
    cov: CovConfig = field(default_factory=CovConfig)
    overlong: OverlongConfig = field(default_factory=OverlongConfig)


@dataclass
class ExpertConfig:
    """Expert iteration (rejection-sampling fine-tuning, `embodied/train/expert.py`): per round, sample
    `samples` answers to each of `prompts_per_round` training prompts, score them with the reward (the
    simulator for interactive episodes), keep each prompt's verified best answer, then fine-tune on the kept
    answers. Answers scored in all: `rounds * prompts_per_round * samples` (the env-feedback `expert` arm's
    defaults, 4 x 200 x 16 = 12,800, equal GRPO's 100 steps x 32 prompts x 4 answers). With `env.turns` > 1
    it samples `samples` multi-turn trajectories per prompt and keeps, per prompt and turn, the answer that
    succeeded at that turn with the conversation that led to it (`keep=success` only)."""

    rounds: int = 4
    prompts_per_round: int = 200
    """Training prompts drawn (without replacement within a round) per round; 0 = every training prompt."""
    samples: int = 16
    """Answers sampled per prompt (the N of best-of-N)."""
    temperature: float = 1.0
    keep: str = "success"
    """success: keep a prompt's highest-reward answer among those that succeeded (`reward/success`, or
    `reward/accuracy` for MCQs), none if none did | best: keep its highest-reward answer whenever the
    prompt's answers differ in reward (above-average, as GRPO's positive advantage), success or not."""
    retry_targets: str = "own"
    """Multi-turn (`env.turns` > 1) targets of a later turn. own: the answer that succeeded at that turn of
    that trajectory | group: also, after each distinct run of failed answers in the prompt's group, the
    group's best answer that succeeded at any turn (every answer is executed from the same reset, so it
    succeeds at any turn): a retry is taught from its siblings' successes, at no extra simulator call, where
    the policy's own retries rarely succeed (`train.expert_targets.select_turns`) | better: after each such
    run, the group's answer nearest to the last failed one (by the task's `action_value`) among those the
    simulator scored higher, success or not: the smallest move that did better, a correction rather than the
    answer."""
    sft_steps: int = 50
    """Fine-tuning steps per round on that round's kept answers (fresh AdamW, warmup + cosine, as SFT)."""
    batch_size: int = 16
    lr: float = 5e-4
    """Peak learning rate of each round's fine-tuning (`sft.*` gives the rest: warmup, clip, vision scale)."""
    sample_batch: int = 32
    """Prompts sampled together (each with `samples` answers) in one generate call."""
    replay: bool = False
    """false: a round fine-tunes on that round's kept answers only | true: on every training prompt's latest
    kept answer from this round and every earlier one (a verified answer stays a valid target; the data grow
    as ReST's do, the steps per round stay `sft_steps`). Single-turn only (`env.turns=1`)."""
    balance: str = "none"
    """none: a round fine-tunes on its kept answers as they come | failures: on `sft_steps * batch_size`
    examples drawn from them so that each task's share follows its share of the round's failed samples
    (plus 0.1): on a pool of several tasks, one the policy has solved does not crowd out one it has not
    (`train.expert_targets.balanced`, logged as `expert/tuned_<task>`)."""
