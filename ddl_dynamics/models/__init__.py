"""The Delta operator and the depth-model families, behind one registry.

Nothing here knows a task, a trainer, a store or a report.
"""
