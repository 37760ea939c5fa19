"""The renderers: a `Report` as Markdown, CSV or JSON (`formats`) or as one HTML page with its
figures (`html`). They only lay out the report's text; nothing here judges or words.
"""
