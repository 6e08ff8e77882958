"""The serving core behind `python -m sru_lightning serve`: request validation
(:mod:`.requests`), the scheduler that steps every open stream as one batch (:mod:`.scheduler`)
and the HTTP application (:mod:`.http`). See docs/serving.md."""
