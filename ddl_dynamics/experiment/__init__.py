"""Running experiments: TOML configs, the trainer, the runner and the results store."""
