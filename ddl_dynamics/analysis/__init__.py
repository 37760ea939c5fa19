"""Reading results: report, expectations, probes, regime analysis, figures and HTML.

Everything here reads the results store and cached probes; nothing retrains.
"""
