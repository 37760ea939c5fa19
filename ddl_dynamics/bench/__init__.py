"""Benchmarks as data: rows of measured times and ratios, and a table for each.

One module per benchmark, its table beside it: `operator` (the Delta update against
an add and the dense operator), `steps` (a training step of each vector family against
its additive baseline, alone and folded), `compiled` (each vector family's folded step,
eager against compiled), `transformer` (the Transformer variants'
training throughput), `folded` (the depth study's folded Transformer step, eager
against compiled), `ode` (where a neural ODE's step goes), `scaling` (a step's
time and memory against members, width and depth) and `suite` (an experiment's wall
time); `timing` times them all alike, and `run` is ``ddl-dyn bench``. Every
training step timed is the trainer's own
(`training_step`).
"""
