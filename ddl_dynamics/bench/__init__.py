"""Benchmarks as data: rows of measured times and ratios, and a table for each.

One module per benchmark, its table beside it: :mod:`.operator` (the Delta update against
an add and the dense operator), :mod:`.steps` (a training step of each vector family against
its additive baseline, alone and folded), :mod:`.transformer` (the Transformer variants'
training throughput), :mod:`.folded` (the depth study's folded Transformer step, eager
against compiled), :mod:`.ode` (where a neural ODE's step goes), :mod:`.scaling` (a step's
time and memory against members, width and depth) and :mod:`.suite` (an experiment's wall
time); :mod:`.timing` times them all alike, and :mod:`.run` is ``ddl-dyn bench``. Every
training step timed is the trainer's own
(:func:`~ddl_dynamics.experiment.step.training_step`).
"""
