"""What a person sees: `live.py` is a run's view (a widget in a notebook, a bar in a terminal, or nothing) and
`overview.py` is `show()`: the whole store at a glance."""
