"""The shared tiny-run setting: conf/debug/tiny.yaml shrinks the default fit to a run of a few
seconds on a laptop CPU (users run it as `fit debug=tiny`); the CLI and sweep tests use it."""

TINY_RUN = ["debug=tiny"]
