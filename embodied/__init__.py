"""embodied: train physical-reasoning vision-language policies with SFT and GRPO."""

__version__ = "0.1.0"
