"""Reading a run: from its results store and cached probes to a judged report, its figures
and its renderings; nothing here retrains.

The modules here read a run (`run`, `results`, `probes`, `shape`) and audit its probes
(`mixing`, `queries`, `hops`, `events`); above them the layers run one way, each importing
only those below it (``[tool.importlinter]``):

- ``judge/``: turns numbers into labels, with no I/O: the statistics, the rule book, the
  comparisons, expectations, crossovers, width sweeps and gate regimes;
- ``report/``: builds the one `Report` of a run, its tables' text and the words a label
  allows;
- ``plots/`` and `figures`: the figures, drawn from the report and the probes, with their
  captions;
- ``render/``: the thin renderers of a report: Markdown, CSV, JSON and HTML.

The published studies (``results/``) and the pages made from them are the ``publish`` wing's,
above this one.
"""
