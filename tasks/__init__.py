"""Built-in tasks, one file per family; importing this package registers them all."""
