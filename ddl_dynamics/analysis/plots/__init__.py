"""Figure builders: plain data in, a matplotlib ``Figure`` out, one house style.

The builders never touch the store or a model (``figures.py`` gathers the data), so
each can be tested on hand-made arrays. A builder that draws models takes ``colors`` (model
label → colour; `row_colors` gives a run's, so a model keeps its colour in
every figure of the run) and names the model and the task in its titles. Intervals are
clipped to the range their quantity can take (a share to [0, 1], an MSE above 0 on a log
axis).

The house style and the helpers every builder shares are in `style`; the builders
by subject: the gates of a Delta stack (`gates`), what happens over depth
(`depth`), training (`training`), the results and their verdicts
(`summary`), and the comparisons across a task's knob (`sweeps`).
"""
