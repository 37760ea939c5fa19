"""The report: the one `Report` value a run reads as (`build`), its tables as cell text and
its notes (`text`), and the words a text may use for each label (`wording`), shared by every
renderer and page so that none words a label its own way.
"""
