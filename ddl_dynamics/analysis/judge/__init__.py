"""Judging: numbers in, labels out, and nothing read or written on the way.

The statistics (`stats`), the labels and the rule book that gives them (`labels`,
`verdicts`), and what they judge: a run's comparisons (`comparisons`), its tasks'
expectations (`expectations`), the comparisons followed over a knob (`crossover`), the width
sweeps (`width`) and the gate regimes (`regimes`). Each reads a run already loaded (`Run`) or
arrays already probed, so every rule can be tested on hand-made values.
"""
