"""Published studies: ``results/<study>/`` written from a run folder (`publish`, `study`), and
everything read from those files alone: the documentation's generated pages (`pages`,
`study_page`, `matrix`, with the finding by question and each study's answer: `finding`,
`answer`) and a rerun checked against its reference (`reproduce`).

It sits between the command line and ``analysis``: it builds on the report, its words and its
figures, and nothing in ``analysis`` reads a published study.
"""
