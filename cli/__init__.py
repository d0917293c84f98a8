"""`regatta`: the command line for teams (submit, list, watch, cancel)."""
