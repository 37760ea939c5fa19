"""Built-in tasks, one file per family; importing this package registers them all."""

from . import (
    char_lm,
    depth_recall,
    mqar,
    nested_spheres,
    oscillators,
    overwrite,
    parity,
    seq_overwrite,
    seq_parity,
    sign_flip,
    swap_track,
    switched,
    var_chain,
)

__all__ = [
    "char_lm",
    "depth_recall",
    "mqar",
    "nested_spheres",
    "oscillators",
    "overwrite",
    "parity",
    "seq_overwrite",
    "seq_parity",
    "sign_flip",
    "swap_track",
    "switched",
    "var_chain",
]
