"""Developer tools run with ``python -m blockscale.tools.<name>`` (e.g. ``bundle``)."""
