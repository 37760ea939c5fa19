"""Built-in tasks, one file per family; importing this package registers them all."""

from . import depth_recall, nested_spheres, oscillators, overwrite, parity, sign_flip

__all__ = ["depth_recall", "nested_spheres", "oscillators", "overwrite", "parity", "sign_flip"]
