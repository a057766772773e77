"""The conversion engine: inputs, executors, the ordered-write runner, resume checkpoints, disk estimates. Commands call it; formats never see it."""
