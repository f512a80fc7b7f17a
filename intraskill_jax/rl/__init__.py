"""GRPO: pure loss functions, the train step, the learner and the SFT warm start."""
