"""A run's bookkeeping: checkpoints, per-round reporting, metrics and TensorBoard logs, run setup."""
