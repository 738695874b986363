"""Training: SFT on demonstrations and GRPO on rollout batches, with resumable Hugging Face checkpoints."""
